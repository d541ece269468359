//! The daemon's configuration: `--config FILE` (TOML) and flags; a flag wins
//! over the file.
//!
//! ```toml
//! listen = "127.0.0.1:7878"   # --listen
//! disk_pool = 2               # --disk-pool: formatted task disks kept ready
//!
//! [store]                     # the task database (--store)
//! url = "postgres://cairn@db.example/cairn"   # or "sqlite:///PATH"; default: SQLite, $CAIRN_HOME/cairn.db
//!
//! [defaults]                  # limits of tasks created without flags
//! memory = "512M"
//! cpus = "1"
//! pids = 256
//! disk = "2G"
//! idle_suspend = "30m"        # suspend tasks idle this long ("never", the default)
//! isolation = "native"        # --isolation: the driver of tasks created without one ("gvisor")
//!
//! [images]                    # what one image import or pull may unpack
//! max_size = "64G"            # bytes of file data written (holes of sparse files not counted)
//! max_apparent_size = "1T"    # apparent size of the files, holes included
//!
//! [disk]                      # how task disks share the filesystem of $CAIRN_HOME/disks
//! reserve = "5G"              # --disk-reserve: kept free for the daemon's own data; no task disk is
//!                             # admitted into it (default: 5 % of the filesystem, at least 1G)
//! budget = "500G"             # at most this much in all task disks' sizes (default: no cap)
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
//!
//! [blob]                      # where snapshots' data is stored
//! url = "s3://bucket/prefix"  # --blob: a local path, file:///PATH, or S3-compatible
//!                             # storage (configured by AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
//!                             # AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP);
//!                             # default: the home's blobs directory
//! cache_size = "2G"           # --blob-cache-size: local cache of a remote store's packs ("0": none)
//!
//! [egress]
//! allow = ["packages.example.com"]        # default policy of tasks created without --allow/--deny
//! deny = []
//! allow_private = []          # reserved ranges the proxy may connect to, e.g. "127.0.0.0/8"
//! max_connections = 64        # open proxy connections per task
//! idle_timeout = "5m"         # a tunnel with no bytes either way is closed
//! max_duration = "1h"         # and any tunnel after this long
//! handshake_timeout = "10s"   # for a request head and a TLS ClientHello
//!
//! [egress.hosts]              # names the proxy resolves itself (tests, closed networks)
//! "pkgs.internal" = "10.1.2.3"          # or "10.1.2.3:8080", or a list
//!
//! [limits]                    # what clients may hold open at once; past a bound a
//!                             # request is refused with 429 (docs/api.md, "Overload")
//! execs_per_task = 64         # --execs-per-task: commands running in one task
//! execs_total = 937           # --execs-total: in the whole daemon; default: derived
//!                             # from the descriptor limit (this is for 20000)
//! streams_per_task = 64       # --streams-per-task: open event streams (task watch) of one task
//! streams_total = 1875        # --streams-total: of the whole daemon; default: derived
//!
//! [hooks]                     # outgoing notifications (`cairn hooks`, docs/notifications.md)
//! give_up_after = "24h"       # a notification unanswered with a 2xx this long after its event fails
//! timeout = "10s"             # for one attempt: connecting, sending, the receiver's answer
//! ca_file = "/etc/cairn/hooks-ca.pem"   # PEM certificates trusted for https receivers, besides the host's
//!
//! [node]                      # this daemon as a node of a cluster (a shared store)
//! name = "alpha"              # --node; default: the host name
//! capacity = 50               # --capacity: the most sandboxes it runs; default: no limit
//! lease = "10s"               # --lease: how long a task's lease lasts unrenewed: a lost node's tasks run
//!                             # elsewhere after it; heartbeats every fifth of it (3s to 10m)
//! url = "http://10.0.0.5:7878"  # --advertise: where other nodes and links reach it;
//!                             # default: http:// and the listen address
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
    /// The task database; `None`: SQLite in the home (`cairn.db`).
    pub store: Option<cairn_store::StoreUrl>,
    pub defaults: Limits,
    pub retention: Retention,
    /// Commands matching one of these take a `pre-risk` snapshot first.
    pub risky_patterns: Vec<String>,
    pub gc_grace: Duration,
    /// Suspend tasks idle this long, unless they say otherwise.
    pub idle_suspend: Option<Duration>,
    /// The isolation driver of tasks created without one.
    pub isolation: cairn_core::Isolation,
    pub egress: EgressConfig,
    pub blob: BlobConfig,
    /// This daemon's node name (`--node`, `[node] name`); `None`: the host
    /// name.
    pub node: Option<String>,
    /// How many sandboxes this node runs at most (`--capacity`, `[node]
    /// capacity`); `None`: no limit but the host's. A full node wakes and
    /// recovers no more tasks: another node of the cluster does.
    pub capacity: Option<usize>,
    /// `[node] lease`: how long a task's lease lasts without a renewal.
    /// A lost node's tasks are recovered elsewhere after it; each node
    /// heartbeats (and renews) every fifth of it. Every node of a cluster
    /// should have the same.
    pub lease: Duration,
    /// The URL other nodes and links reach this daemon at (`--advertise`,
    /// `[node] url`); `None`: `http://` and the listen address, which is
    /// right for one machine and for a listen address others can reach.
    pub node_url: Option<String>,
    /// `[limits]`: what clients may hold open at once.
    pub limits: LimitsConfig,
    /// `[disk]`: how new task disks are admitted against the free space.
    pub disk_space: cairn_sandbox::DiskSpace,
    /// `[images]`: what one import or pull may unpack.
    pub image_limits: cairn_image::ImportLimits,
    /// `[secrets] cluster_key_file`: on a cluster, the key every node holds
    /// (the same file on each), under which the secrets key is shared
    /// through the store; `None`: secrets are not served on a cluster.
    pub secrets_cluster_key: Option<std::path::PathBuf>,
    /// `[hooks]`: how outgoing notifications are sent.
    pub hooks: HooksConfig,
}

/// The `[limits]` table: bounds on what clients hold open at once. A
/// total left out is derived from the daemon's descriptor limit at start
/// (`crate::admission`), which also refuses totals that do not fit in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsConfig {
    pub execs_per_task: usize,
    pub execs_total: Option<usize>,
    pub streams_per_task: usize,
    pub streams_total: Option<usize>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig { execs_per_task: 64, execs_total: None, streams_per_task: 64, streams_total: None }
    }
}

/// A bound of `[limits]` (or its flag): a whole number of at least 1.
pub fn parse_bound(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a bound (a whole number of at least 1)")),
    }
}

/// The `[blob]` table: where snapshots' packs, index files and manifests
/// are stored.
#[derive(Debug, Clone)]
pub struct BlobConfig {
    /// `None`: the home's `blobs` directory.
    pub url: Option<cairn_blob::BlobUrl>,
    /// Bound of the local cache (`<home>/blob-cache`) of a remote store's
    /// packs; 0 turns it off.
    pub cache_size: u64,
}

impl Default for BlobConfig {
    fn default() -> Self {
        BlobConfig { url: None, cache_size: cairn_blob::DEFAULT_CACHE_BYTES }
    }
}

impl BlobConfig {
    /// `--blob URL`.
    pub fn set_url(&mut self, url: &str) -> Result<(), String> {
        self.url = Some(cairn_blob::BlobUrl::parse(url)?);
        Ok(())
    }

    /// `--blob-cache-size SIZE`.
    pub fn set_cache_size(&mut self, size: &str) -> Result<(), String> {
        self.cache_size = cairn_core::parse_bytes(size).map_err(|e| format!("blob cache size: {e}"))?;
        Ok(())
    }
}

/// The `[egress]` table, checked.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Rules of tasks created without any of their own.
    pub default_rules: cairn_core::EgressRules,
    pub allow_private: cairn_egress::AllowedRanges,
    /// Normalised name -> addresses (a port replaces the requested one).
    pub hosts: std::collections::BTreeMap<String, Vec<(std::net::IpAddr, Option<u16>)>>,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub max_duration: Duration,
    pub handshake_timeout: Duration,
    /// A PEM bundle trusted for upstream certificates of intercepted hosts,
    /// besides the host's roots (`[egress] upstream_ca`).
    pub upstream_ca: Option<std::path::PathBuf>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            default_rules: cairn_core::EgressRules::default(),
            allow_private: cairn_egress::AllowedRanges::default(),
            hosts: Default::default(),
            max_connections: 64,
            idle_timeout: Duration::from_secs(300),
            max_duration: Duration::from_secs(3600),
            handshake_timeout: Duration::from_secs(10),
            upstream_ca: None,
        }
    }
}

impl EgressConfig {
    /// What `cairn serve` prints at start-up when the operator opened
    /// anything beyond the public internet.
    pub fn exceptions(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.allow_private.is_empty() {
            let ranges: Vec<String> = self.allow_private.clone().into();
            lines.push(format!("egress: reserved ranges allowed: {}", ranges.join(", ")));
        }
        for (name, addrs) in &self.hosts {
            let addrs: Vec<String> = addrs
                .iter()
                .map(|(ip, port)| match port {
                    Some(p) => std::net::SocketAddr::new(*ip, *p).to_string(),
                    None => ip.to_string(),
                })
                .collect();
            lines.push(format!("egress: {name} resolves to {}", addrs.join(", ")));
        }
        lines
    }
}

/// Checks allow and deny rules and returns them normalised.
pub fn egress_rules(allow: &[String], deny: &[String]) -> Result<cairn_core::EgressRules, cairn_egress::Error> {
    egress_rules_with(allow, deny, &[], &[])
}

/// Checks allow, deny, request rules and injections together (each request
/// rule and injection needs a host the allow rules cover) and returns them
/// normalised.
pub fn egress_rules_with(allow: &[String], deny: &[String], rules: &[String], inject: &[String]) -> Result<cairn_core::EgressRules, cairn_egress::Error> {
    let policy = cairn_egress::Policy::parse(allow, deny)?.with_requests(rules, inject)?;
    Ok(cairn_core::EgressRules {
        allow: policy.allow.iter().map(ToString::to_string).collect(),
        deny: policy.deny.iter().map(ToString::to_string).collect(),
        rules: policy.requests.iter().map(ToString::to_string).collect(),
        inject: policy.injections.iter().map(ToString::to_string).collect(),
    })
}

/// One `[egress.hosts]` address: `IP` or `IP:PORT` (`[v6]:PORT`).
fn host_address(name: &str, s: &str) -> Result<(std::net::IpAddr, Option<u16>), String> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok((sa.ip(), Some(sa.port())));
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| (ip, None))
        .map_err(|_| format!("egress.hosts.{name:?}: {s:?} is not an IP address or IP:PORT"))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            disk_pool: 2,
            store: None,
            defaults: Limits::default(),
            retention: Retention::default(),
            risky_patterns: DEFAULT_RISK_PATTERNS.iter().map(|p| (*p).to_owned()).collect(),
            gc_grace: Duration::from_secs(3600),
            idle_suspend: None,
            isolation: cairn_core::Isolation::Native,
            egress: EgressConfig::default(),
            blob: BlobConfig::default(),
            node: None,
            capacity: None,
            lease: DEFAULT_LEASE,
            node_url: None,
            limits: LimitsConfig::default(),
            disk_space: cairn_sandbox::DiskSpace::default(),
            image_limits: cairn_image::ImportLimits::default(),
            secrets_cluster_key: None,
            hooks: HooksConfig::default(),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    disk_pool: Option<usize>,
    #[serde(default)]
    store: StoreFile,
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    snapshots: Snapshots,
    #[serde(default)]
    egress: EgressFile,
    #[serde(default)]
    blob: BlobFile,
    #[serde(default)]
    node: NodeFile,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    disk: DiskFile,
    #[serde(default)]
    images: ImagesFile,
    #[serde(default)]
    secrets: SecretsFile,
    #[serde(default)]
    hooks: HooksFile,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HooksFile {
    give_up_after: Option<String>,
    timeout: Option<String>,
    ca_file: Option<std::path::PathBuf>,
}

/// How outgoing notifications are sent (`[hooks]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HooksConfig {
    /// A notification not answered with a 2xx this long after its event
    /// is given up and kept as failed.
    pub give_up_after: Duration,
    /// One attempt's bound: connecting, sending and the answer.
    pub timeout: Duration,
    /// PEM certificates trusted for `https` receivers besides the host's roots.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for HooksConfig {
    fn default() -> Self {
        HooksConfig { give_up_after: Duration::from_secs(24 * 3600), timeout: Duration::from_secs(10), ca_file: None }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SecretsFile {
    cluster_key_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ImagesFile {
    max_size: Option<String>,
    max_apparent_size: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DiskFile {
    reserve: Option<String>,
    budget: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    execs_per_task: Option<toml::Value>,
    execs_total: Option<toml::Value>,
    streams_per_task: Option<toml::Value>,
    streams_total: Option<toml::Value>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BlobFile {
    url: Option<String>,
    cache_size: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: Option<String>,
    capacity: Option<usize>,
    url: Option<String>,
    lease: Option<String>,
}

/// How long a task's lease lasts unrenewed, unless `[node] lease` says.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// A shorter lease would expire over a slow heartbeat; a longer one
/// leaves a lost node's tasks waiting for no gain.
const MIN_LEASE: Duration = Duration::from_secs(3);
const MAX_LEASE: Duration = Duration::from_secs(600);

/// Parses a lease's length (`[node] lease`, `--lease`): 3 s to 10 min.
pub fn parse_lease(s: &str) -> Result<Duration, String> {
    let lease = parse_duration(s).map_err(|e| e.to_string())?;
    if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
        return Err(format!("{s:?} is outside 3s to 10m"));
    }
    Ok(lease)
}

/// Checks a node name: 1 to 63 characters, letters, digits, `-`, `_`, `.`.
pub fn parse_node_name(s: &str) -> Result<String, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if s.is_empty() || s.len() > 63 || !s.chars().all(ok) {
        return Err(format!("{s:?} is not a node name (1 to 63 letters, digits, '-', '_', '.')"));
    }
    Ok(s.to_owned())
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    url: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct EgressFile {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    allow_private: Vec<String>,
    max_connections: Option<usize>,
    idle_timeout: Option<String>,
    max_duration: Option<String>,
    handshake_timeout: Option<String>,
    upstream_ca: Option<std::path::PathBuf>,
    #[serde(default)]
    hosts: std::collections::BTreeMap<String, OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
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
    isolation: Option<String>,
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
        if let Some(u) = file.store.url {
            c.store = Some(parse_store(&u).map_err(|e| format!("store.url: {e}"))?);
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
        if let Some(i) = d.isolation {
            c.isolation = i.parse().map_err(|e| format!("defaults.isolation: {e}"))?;
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
        c.egress = Self::parse_egress(file.egress)?;
        if let Some(u) = file.blob.url {
            c.blob.set_url(&u).map_err(|e| format!("blob.url: {e}"))?;
        }
        if let Some(size) = file.blob.cache_size {
            c.blob.set_cache_size(&size).map_err(|e| format!("blob.cache_size: {e}"))?;
        }
        if let Some(n) = file.node.name {
            c.node = Some(parse_node_name(&n).map_err(|e| format!("node.name: {e}"))?);
        }
        if let Some(n) = file.node.capacity {
            c.capacity = Some(n);
        }
        if let Some(u) = file.node.url {
            c.node_url = Some(parse_node_url(&u).map_err(|e| format!("node.url: {e}"))?);
        }
        if let Some(l) = file.node.lease {
            c.lease = parse_lease(&l).map_err(|e| format!("node.lease: {e}"))?;
        }
        if let Some(r) = file.disk.reserve {
            c.disk_space.reserve = Some(cairn_core::parse_bytes(&r).map_err(|e| format!("disk.reserve: {e}"))?);
        }
        if let Some(m) = file.images.max_size {
            c.image_limits.max_expanded_size = cairn_core::parse_bytes(&m).map_err(|e| format!("images.max_size: {e}"))?;
        }
        if let Some(m) = file.images.max_apparent_size {
            c.image_limits.max_logical_size = cairn_core::parse_bytes(&m).map_err(|e| format!("images.max_apparent_size: {e}"))?;
        }
        if let Some(k) = file.secrets.cluster_key_file {
            c.secrets_cluster_key = Some(k);
        }
        let positive = |key: &str, v: &str| -> Result<Duration, String> {
            match parse_duration(v) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err(format!("hooks.{key}: must be more than zero")),
                Err(err) => Err(format!("hooks.{key}: {err}")),
            }
        };
        if let Some(v) = file.hooks.give_up_after {
            c.hooks.give_up_after = positive("give_up_after", &v)?;
        }
        if let Some(v) = file.hooks.timeout {
            c.hooks.timeout = positive("timeout", &v)?;
        }
        if let Some(path) = file.hooks.ca_file {
            let pem = std::fs::read(&path).map_err(|err| format!("hooks.ca_file {}: {err}", path.display()))?;
            crate::notify::ca_certificates(&pem).map_err(|err| format!("hooks.ca_file {}: {err}", path.display()))?;
            c.hooks.ca_file = Some(path);
        }
        if let Some(b) = file.disk.budget {
            c.disk_space.budget = Some(cairn_core::parse_bytes(&b).map_err(|e| format!("disk.budget: {e}"))?);
        }
        let bound = |key: &str, v: Option<toml::Value>| -> Result<Option<usize>, String> {
            v.map(|v| parse_bound(&value_text(&v)).map_err(|e| format!("limits.{key}: {e}"))).transpose()
        };
        let l = file.limits;
        if let Some(n) = bound("execs_per_task", l.execs_per_task)? {
            c.limits.execs_per_task = n;
        }
        c.limits.execs_total = bound("execs_total", l.execs_total)?;
        if let Some(n) = bound("streams_per_task", l.streams_per_task)? {
            c.limits.streams_per_task = n;
        }
        c.limits.streams_total = bound("streams_total", l.streams_total)?;
        Ok(c)
    }

    fn parse_egress(f: EgressFile) -> Result<EgressConfig, String> {
        let mut e = EgressConfig {
            default_rules: egress_rules(&f.allow, &f.deny).map_err(|e| format!("egress: {e}"))?,
            allow_private: cairn_egress::AllowedRanges::parse(&f.allow_private).map_err(|e| format!("egress.allow_private: {e}"))?,
            upstream_ca: f.upstream_ca,
            ..EgressConfig::default()
        };
        if let Some(path) = &e.upstream_ca {
            let pem = std::fs::read(path).map_err(|err| format!("egress.upstream_ca {}: {err}", path.display()))?;
            cairn_egress::proxy::upstream_tls(Some(&pem)).map_err(|err| format!("egress.upstream_ca {}: {err}", path.display()))?;
        }
        if let Some(n) = f.max_connections {
            if n == 0 {
                return Err("egress.max_connections: must be at least 1".into());
            }
            e.max_connections = n;
        }
        let positive = |key: &str, v: &str| -> Result<Duration, String> {
            match parse_duration(v) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err(format!("egress.{key}: must be more than zero")),
                Err(err) => Err(format!("egress.{key}: {err}")),
            }
        };
        if let Some(v) = f.idle_timeout {
            e.idle_timeout = positive("idle_timeout", &v)?;
        }
        if let Some(v) = f.max_duration {
            e.max_duration = positive("max_duration", &v)?;
        }
        if let Some(v) = f.handshake_timeout {
            e.handshake_timeout = positive("handshake_timeout", &v)?;
        }
        for (name, addrs) in f.hosts {
            let host = cairn_egress::normalise(&name).map_err(|err| format!("egress.hosts: {err}"))?;
            let addrs = match addrs {
                OneOrMany::One(a) => vec![a],
                OneOrMany::Many(v) => v,
            };
            if addrs.is_empty() {
                return Err(format!("egress.hosts.{name:?}: no address"));
            }
            let parsed = addrs.iter().map(|a| host_address(&name, a)).collect::<Result<Vec<_>, _>>()?;
            e.hosts.insert(host.to_string(), parsed);
        }
        Ok(e)
    }
}

/// A store URL: `sqlite://PATH` or `postgres://...`.
pub fn parse_store(s: &str) -> Result<cairn_store::StoreUrl, String> {
    s.parse().map_err(|e: cairn_store::Error| e.to_string())
}

/// Checks the URL a node announces: `http://` (the daemon serves plain
/// HTTP, and nodes forward to each other over it), a host, no path beyond
/// `/` (a trailing one is dropped).
pub fn parse_node_url(s: &str) -> Result<String, String> {
    let rest = s.strip_prefix("http://");
    let host = rest.map(|r| r.trim_end_matches('/')).unwrap_or_default();
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
        return Err(format!("{s:?} is not a node URL (http://HOST[:PORT])"));
    }
    Ok(s.trim_end_matches('/').to_owned())
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

    #[test]
    fn hooks_take_their_times_and_a_readable_ca_file() {
        let c = Config::parse("[hooks]\ngive_up_after = \"2s\"\ntimeout = \"500ms\"\n").unwrap();
        assert_eq!((c.hooks.give_up_after, c.hooks.timeout), (Duration::from_secs(2), Duration::from_millis(500)));
        assert_eq!(Config::parse("").unwrap().hooks, HooksConfig::default());
        assert!(Config::parse("[hooks]\ntimeout = \"0s\"").unwrap_err().contains("hooks.timeout: must be more than zero"));
        assert!(Config::parse("[hooks]\ngive_up_after = \"soon\"").unwrap_err().contains("hooks.give_up_after"));
        assert!(Config::parse("[hooks]\nca_file = \"/nonexistent/ca.pem\"").unwrap_err().contains("hooks.ca_file /nonexistent/ca.pem"));
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = Config::parse(&format!("[hooks]\nca_file = {:?}", junk.display().to_string())).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        assert!(Config::parse("[hooks]\nretries = 3").unwrap_err().contains("retries"));
    }

    #[test]
    fn the_disk_section_sets_the_reserve_and_the_budget() {
        assert_eq!(Config::default().disk_space, cairn_sandbox::DiskSpace { reserve: None, budget: None });
        let c = Config::parse("[disk]\nreserve = \"3G\"\nbudget = \"500G\"\n").unwrap();
        assert_eq!(c.disk_space, cairn_sandbox::DiskSpace { reserve: Some(3 << 30), budget: Some(500 << 30) });
        assert!(Config::parse("[disk]\nreserve = \"lots\"").unwrap_err().contains("disk.reserve"));
        assert!(Config::parse("[disk]\nbudget = \"-1\"").unwrap_err().contains("disk.budget"));
    }

    #[test]
    fn blob_section_names_the_store_and_the_cache_bound() {
        let c = Config::default();
        assert_eq!((c.blob.url.as_ref(), c.blob.cache_size), (None, 2 << 30));
        let c = Config::parse("[blob]\nurl = \"s3://cairn-snaps/node-pool\"\ncache_size = \"512M\"\n").unwrap();
        assert_eq!(c.blob.url, Some(cairn_blob::BlobUrl::S3("s3://cairn-snaps/node-pool".into())));
        assert_eq!(c.blob.cache_size, 512 << 20);
        let c = Config::parse("[blob]\nurl = \"file:///srv/blobs\"\ncache_size = \"0\"\n").unwrap();
        assert_eq!((c.blob.url, c.blob.cache_size), (Some(cairn_blob::BlobUrl::Local("/srv/blobs".into())), 0));
        for (bad, says) in [
            ("[blob]\nurl = \"gs://x/y\"", "blob.url"),
            ("[blob]\nurl = \"s3://UPPER/y\"", "bucket name"),
            ("[blob]\ncache_size = \"lots\"", "blob.cache_size"),
            ("[blob]\nregion = \"eu\"", "region"),
        ] {
            let err = Config::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_store_is_sqlite_in_the_home_unless_a_url_says_otherwise() {
        assert_eq!(Config::default().store, None);
        let c = Config::parse("[store]\nurl = \"postgres://cairn:pw@db.example:5432/cairn\"\n").unwrap();
        assert_eq!(c.store, Some(cairn_store::StoreUrl::Postgres("postgres://cairn:pw@db.example:5432/cairn".into())));
        let c = Config::parse("[store]\nurl = \"sqlite:///srv/cairn.db\"\n").unwrap();
        assert_eq!(c.store, Some(cairn_store::StoreUrl::Sqlite("/srv/cairn.db".into())));
        for bad in ["[store]\nurl = \"mysql://x/y\"", "[store]\nurl = \"postgres://u:pw@h:port/d\""] {
            let err = Config::parse(bad).unwrap_err();
            assert!(err.contains("store.url") && !err.contains(":pw@"), "{bad}: {err}");
        }
        assert!(Config::parse("[store]\npath = \"x\"").unwrap_err().contains("path"));
    }

    #[test]
    fn limits_are_bounds_of_at_least_one_and_totals_default_to_derived() {
        assert_eq!(Config::default().limits, LimitsConfig { execs_per_task: 64, execs_total: None, streams_per_task: 64, streams_total: None });
        let c = Config::parse("[limits]\nexecs_per_task = 4\nexecs_total = 10\nstreams_per_task = 2\nstreams_total = 3\n").unwrap();
        assert_eq!(c.limits, LimitsConfig { execs_per_task: 4, execs_total: Some(10), streams_per_task: 2, streams_total: Some(3) });
        for (bad, key) in [
            ("[limits]\nexecs_per_task = 0", "limits.execs_per_task"),
            ("[limits]\nexecs_total = -1", "limits.execs_total"),
            ("[limits]\nstreams_total = \"many\"", "limits.streams_total"),
            ("[limits]\nconnections = 5", "connections"),
        ] {
            let err = Config::parse(bad).unwrap_err();
            assert!(err.contains(key), "{bad}: {err}");
        }
        assert_eq!(parse_bound("12"), Ok(12));
        assert!(parse_bound("0").unwrap_err().contains("at least 1"));
    }

    #[test]
    fn a_node_url_is_http_and_a_host() {
        let c = Config::parse("[node]\nurl = \"http://10.0.0.5:7878/\"\ncapacity = 3\n").unwrap();
        assert_eq!((c.node_url.as_deref(), c.capacity, c.lease), (Some("http://10.0.0.5:7878"), Some(3), DEFAULT_LEASE));
        assert_eq!(Config::parse("[node]\nlease = \"4s\"\n").unwrap().lease, Duration::from_secs(4));
        for bad in ["2s", "11m", "soon"] {
            let err = Config::parse(&format!("[node]\nlease = \"{bad}\"\n")).unwrap_err();
            assert!(err.starts_with("node.lease: "), "{err}");
        }
        for bad in ["10.0.0.5:7878", "https://x", "ftp://x", "http://", "http://a/b", "http://a b"] {
            assert!(parse_node_url(bad).unwrap_err().contains("not a node URL"), "{bad}");
        }
        assert!(Config::parse("[node]\nurl = \"x\"").unwrap_err().contains("node.url"));
    }

    #[test]
    fn the_node_name_is_the_host_name_unless_the_config_names_it() {
        assert_eq!(Config::default().node, None);
        assert_eq!(Config::parse("[node]\nname = \"alpha-1.rack_2\"\n").unwrap().node.as_deref(), Some("alpha-1.rack_2"));
        for bad in ["[node]\nname = \"\"", "[node]\nname = \"a b\"", "[node]\nname = \"a/b\""] {
            assert!(Config::parse(bad).unwrap_err().contains("node.name"), "{bad}");
        }
        assert!(Config::parse("[node]\nid = \"x\"").unwrap_err().contains("id"));
        assert!(crate::config::parse_node_name(&crate::nodes::default_node_name()).is_ok());
    }

    #[test]
    fn egress_section_is_checked_normalised_and_described() {
        let c = Config::default();
        assert!(c.egress.exceptions().is_empty() && c.egress.allow_private.is_empty() && c.egress.default_rules.allow.is_empty());
        let c = Config::parse(
            "[egress]\nallow = [\"Packages.Example.com.\", \"*.example.com:8443\"]\ndeny = [\"evil.example.com\"]\nallow_private = [\"127.0.0.0/8\", \"fd00::/8\"]\nmax_connections = 8\nidle_timeout = \"30s\"\n[egress.hosts]\n\"Web.Test\" = \"127.0.0.1:8080\"\n\"multi.test\" = [\"10.0.0.1\", \"[::1]:443\"]\n",
        )
        .unwrap();
        let e = &c.egress;
        assert_eq!(e.default_rules.allow, vec!["packages.example.com", "*.example.com:8443"]);
        assert_eq!(e.default_rules.deny, vec!["evil.example.com"]);
        assert_eq!((e.max_connections, e.idle_timeout), (8, Duration::from_secs(30)));
        assert_eq!(e.hosts["web.test"], vec![("127.0.0.1".parse().unwrap(), Some(8080))]);
        assert_eq!(e.hosts["multi.test"], vec![("10.0.0.1".parse().unwrap(), None), ("::1".parse().unwrap(), Some(443))]);
        let printed = e.exceptions().join("\n");
        assert!(printed.contains("127.0.0.0/8, fd00::/8") && printed.contains("web.test resolves to 127.0.0.1:8080"), "{printed}");
        for (bad, key) in [
            ("[egress]\nallow = [\"*\"]", "egress"),
            ("[egress]\nallow_private = [\"10.0.0.0/40\"]", "allow_private"),
            ("[egress]\nmax_connections = 0", "max_connections"),
            ("[egress]\nhandshake_timeout = \"0s\"", "handshake_timeout"),
            ("[egress]\nproxy_port = 1", "proxy_port"),
            ("[egress.hosts]\n\"a.test\" = \"somewhere\"", "somewhere"),
            ("[egress.hosts]\n\"a.test\" = []", "no address"),
            ("[egress.hosts]\n\"a b\" = \"10.0.0.1\"", "egress.hosts"),
        ] {
            let err = Config::parse(bad).unwrap_err();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }
}
