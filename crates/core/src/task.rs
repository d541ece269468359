use serde::{Deserialize, Serialize};

use crate::{Error, Limits, Retention, RollbackNote, SandboxState, TaskId, TaskState};

pub const DEFAULT_IMAGE: &str = "host";
pub const DEFAULT_WORKDIR: &str = "/workspace";

/// One `KEY=VALUE` environment variable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EnvVar {
    pub key: String,
    pub value: String,
}

impl EnvVar {
    pub fn parse(s: &str) -> Result<EnvVar, Error> {
        let (key, value) = s.split_once('=').ok_or_else(|| Error::EnvVar(s.to_owned()))?;
        let valid_key = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid_key || value.contains('\0') {
            return Err(Error::EnvVar(s.to_owned()));
        }
        Ok(EnvVar { key: key.to_owned(), value: value.to_owned() })
    }

    pub fn to_pair(&self) -> String {
        format!("{}={}", self.key, self.value)
    }
}

/// Checks an in-sandbox working directory: absolute, no `..`, no NUL.
pub fn check_workdir(s: &str) -> Result<(), Error> {
    let ok = s.starts_with('/') && !s.contains('\0') && !s.split('/').any(|c| c == "..") && s.len() < 4096;
    if ok {
        Ok(())
    } else {
        Err(Error::Workdir(s.to_owned()))
    }
}

/// Checks a user a command runs as: `user` or `user:group`, each a name or
/// a number within the sandbox's id range (0-65535). Names are resolved
/// inside the sandbox, from its `/etc/passwd` and `/etc/group`.
pub fn check_user(s: &str) -> Result<(), Error> {
    let part_ok = |p: &str| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            p.parse::<u32>().is_ok_and(|n| n < 65536)
        } else {
            p.len() <= 256 && p.bytes().all(|b| b.is_ascii_graphic() && b != b':' && b != b'/')
        }
    };
    let (user, group) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    if !user.is_empty() && part_ok(user) && group.is_none_or(|g| !g.is_empty() && part_ok(g)) {
        Ok(())
    } else {
        Err(Error::User(s.to_owned()))
    }
}

/// The run configuration an image gives the tasks started from it (an OCI
/// image config's `Env`, `WorkingDir`, `User`, `Entrypoint` and `Cmd`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ImageDefaults<'a> {
    pub env: &'a [String],
    pub working_dir: Option<&'a str>,
    pub user: Option<&'a str>,
    pub entrypoint: &'a [String],
    pub cmd: &'a [String],
}

/// Checks a task name: what a user may type instead of the id.
pub fn check_name(s: &str) -> Result<(), Error> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !TaskId::looks_like(s);
    if ok {
        Ok(())
    } else {
        Err(Error::Name(s.to_owned()))
    }
}

/// Checks an image name: a plain name (`alpine-3.20`), or an image
/// reference as a pulled image is named by, `[host[:port]/]path[:tag][@digest]`
/// (`python:3.12-slim`, `127.0.0.1:5000/team/app@sha256:...`). Path
/// components are lowercase as OCI requires; a host and a tag may have
/// upper case. No component starts with `.`, so no name is hidden or `..`.
pub fn check_image_name(s: &str) -> Result<(), Error> {
    if image_reference_ok(s) {
        Ok(())
    } else {
        Err(Error::ImageName(s.to_owned()))
    }
}

/// Longest image name (a reference's limit in the distribution spec).
pub const MAX_IMAGE_NAME: usize = 255;

fn image_reference_ok(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_IMAGE_NAME {
        return false;
    }
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let Some((algo, hex)) = d.split_once(':') else { return false };
        let algo_ok = !algo.is_empty() && algo.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
        let hex_ok = hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        if !algo_ok || !hex_ok {
            return false;
        }
    }
    // A tag follows the last ':' after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && !t.starts_with(['.', '-'])
            && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return false;
        }
    }
    let mut parts: Vec<&str> = path.split('/').collect();
    // The first of several components is a registry host when it looks like
    // one (a dot, a port, or `localhost`), as Docker reads references.
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (name, port) = match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        };
        let name_ok = !name.is_empty()
            && !name.starts_with(['.', '-'])
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b));
        let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
        if !name_ok || !port_ok {
            return false;
        }
    }
    parts.iter().all(|c| {
        !c.is_empty() && !c.starts_with('.') && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
    })
}

/// The environment a task's sandbox is built from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskConfig {
    pub image: String,
    pub limits: Limits,
    pub env: Vec<EnvVar>,
    pub workdir: String,
    /// Which snapshots to keep.
    #[serde(default)]
    pub retention: Retention,
    /// Command patterns that are high-risk for this task, on top of the
    /// daemon's.
    #[serde(default)]
    pub risky: Vec<String>,
    /// Commands started, in order, whenever a sandbox starts for the task
    /// (create, rollback, fork), each detached with its output logged.
    #[serde(default)]
    pub services: Vec<String>,
    /// Suspend the task after this long without activity (`None`: never).
    #[serde(default)]
    pub idle_suspend_ms: Option<u64>,
    /// Where the task may connect through the egress proxy.
    #[serde(default)]
    pub egress: EgressRules,
    /// Who commands run as unless an exec names another (`uid`,
    /// `uid:gid` or a name), from the image's `User`; `None`: root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The image's `Entrypoint`: with `cmd`, what an exec without a
    /// command runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    /// The image's `Cmd`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    /// Which driver isolates the task's sandbox.
    #[serde(default)]
    pub isolation: Isolation,
    /// Suspends keep the sandbox's processes and memory (a checkpoint
    /// stored with the suspend snapshot), so a wake continues them; only a
    /// gvisor sandbox can, and does unless told otherwise.
    #[serde(default)]
    pub keep_memory: bool,
    /// Labels a client gave the task (E2B's sandbox metadata), to find and
    /// list it by.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// When the task ends by itself (Unix time in milliseconds): it is
    /// destroyed then, or suspended when `suspend_at_deadline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend_at_deadline: bool,
}

/// The isolation driver of a task's sandbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Linux namespaces, cgroups and seccomp around the workload itself.
    #[default]
    Native,
    /// gVisor's `runsc`: a second kernel between the workload and the
    /// host's, which can checkpoint the whole sandbox, memory included.
    Gvisor,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Native => "native",
            Isolation::Gvisor => "gvisor",
        }
    }

    /// True when the driver can checkpoint a sandbox's processes.
    pub fn keeps_memory(self) -> bool {
        self == Isolation::Gvisor
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Isolation {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(Isolation::Native),
            "gvisor" => Ok(Isolation::Gvisor),
            other => Err(crate::Error::Isolation(other.to_owned())),
        }
    }
}

impl TaskConfig {
    /// Takes an image's run configuration: its environment under the
    /// task's own (a variable the task sets wins), its working directory
    /// unless the task chose one (`workdir_given`), its user and its
    /// default command. Fails, naming the field, on a working directory or
    /// user the task could not use.
    pub fn apply_image(&mut self, image: &ImageDefaults<'_>, workdir_given: bool) -> Result<(), Error> {
        let mut env: Vec<EnvVar> = Vec::new();
        for pair in image.env {
            // Image variables are taken as the image has them (Docker does
            // not restrict their names); an entry without `=` means nothing.
            let Some((key, value)) = pair.split_once('=') else { continue };
            if key.is_empty() || pair.contains('\0') {
                continue;
            }
            match env.iter_mut().find(|e| e.key == key) {
                Some(e) => e.value = value.to_owned(),
                None => env.push(EnvVar { key: key.to_owned(), value: value.to_owned() }),
            }
        }
        for own in std::mem::take(&mut self.env) {
            env.retain(|e| e.key != own.key);
            env.push(own);
        }
        self.env = env;
        if let Some(dir) = image.working_dir.filter(|d| !d.is_empty()) {
            if !workdir_given {
                check_workdir(dir)?;
                self.workdir = dir.to_owned();
            }
        }
        if let Some(user) = image.user.filter(|u| !u.is_empty()) {
            check_user(user)?;
            self.user = Some(user.to_owned());
        }
        self.entrypoint = image.entrypoint.to_vec();
        self.cmd = image.cmd.to_vec();
        Ok(())
    }

    /// What an exec without a command runs: the image's `Entrypoint`
    /// followed by its `Cmd` (empty when the image has neither).
    pub fn default_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

/// A task's egress allow and deny rules (`HOST[:PORT]`, `*.example.com`),
/// kept in the normalised form the egress crate checked them in. Empty
/// allow: the sandbox is offline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EgressRules {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// Request rules, `HOST=METHODS PATH_PREFIX`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// Injections, `HOST=HEADER: VALUE` (secrets as `{{secret:NAME}}`) or
    /// `HOST=$NAME`. Secrets by name only, never a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inject: Vec<String>,
}

impl EgressRules {
    /// Whether the proxy intercepts some host (and the task has a CA).
    pub fn intercepts(&self) -> bool {
        !self.rules.is_empty() || !self.inject.is_empty()
    }
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            image: DEFAULT_IMAGE.to_owned(),
            limits: Limits::default(),
            env: Vec::new(),
            workdir: DEFAULT_WORKDIR.to_owned(),
            retention: Retention::default(),
            risky: Vec::new(),
            services: Vec::new(),
            idle_suspend_ms: None,
            egress: EgressRules::default(),
            user: None,
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            isolation: Isolation::Native,
            keep_memory: false,
            metadata: Default::default(),
            deadline_ms: None,
            suspend_at_deadline: false,
        }
    }
}

/// The durable record of a task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Task {
    pub id: TaskId,
    pub name: Option<String>,
    pub state: TaskState,
    pub config: TaskConfig,
    pub step: u64,
    pub memory: String,
    /// Unix time in milliseconds.
    pub created_ms: i64,
    pub last_activity_ms: i64,
    pub sandbox: SandboxState,
    /// Why the sandbox is in its state, when that is worth telling (e.g. lost).
    pub sandbox_note: Option<String>,
    /// The latest rollback, so the agent sees why its last attempt failed.
    pub rollback_note: Option<RollbackNote>,
    /// Set when the daemon rebuilt a lost sandbox from the latest snapshot:
    /// which snapshot, which step, what was lost since.
    pub recovery_note: Option<String>,
    /// The Standard Webhooks secret (`whsec_...`) senders sign with.
    pub webhook_secret: Option<String>,
    /// The node whose daemon runs the task's sandbox, while one is up.
    #[serde(default)]
    pub node: Option<String>,
}

impl Task {
    /// A task just created: no sandbox yet, step 0, empty memory summary.
    pub fn new(id: TaskId, name: Option<String>, config: TaskConfig, now_ms: i64) -> Task {
        Task {
            id,
            name,
            state: TaskState::Created,
            config,
            step: 0,
            memory: String::new(),
            created_ms: now_ms,
            last_activity_ms: now_ms,
            sandbox: SandboxState::None,
            sandbox_note: None,
            rollback_note: None,
            recovery_note: None,
            webhook_secret: None,
            node: None,
        }
    }
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecExit {
    /// The code `cairn exec` exits with: the command's code, 128+signal when it
    /// was killed, or [`ExecExit::TIMEOUT_CODE`] when it ran out of time.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
}

impl ExecExit {
    /// Exit code on timeout, as `timeout(1)` uses.
    pub const TIMEOUT_CODE: i32 = 124;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_vars() {
        assert_eq!(EnvVar::parse("A=b=c").unwrap(), EnvVar { key: "A".into(), value: "b=c".into() });
        assert_eq!(EnvVar::parse("EMPTY=").unwrap().value, "");
        for bad in ["noequals", "=v", "1A=v", "A-B=v", "A B=v"] {
            assert!(EnvVar::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn env_vars_join_back_to_key_equals_value() {
        assert_eq!(EnvVar::parse("A=b=c").unwrap().to_pair(), "A=b=c");
        assert_eq!(EnvVar { key: "EMPTY".into(), value: String::new() }.to_pair(), "EMPTY=");
    }

    #[test]
    fn a_workdir_is_shorter_than_a_path_may_be() {
        let longest = format!("/{}", "a".repeat(4094));
        assert_eq!(check_workdir(&longest), Ok(()));
        let too_long = format!("{longest}b");
        assert_eq!(check_workdir(&too_long), Err(Error::Workdir(too_long.clone())));
    }

    fn image<'a>(env: &'a [String], entrypoint: &'a [String], cmd: &'a [String]) -> ImageDefaults<'a> {
        ImageDefaults { env, working_dir: Some("/srv/app"), user: Some("1000:1000"), entrypoint, cmd }
    }

    #[test]
    fn an_image_config_goes_under_the_tasks_own() {
        let env = ["A=image".to_owned(), "B=image".to_owned(), "PATH=/image/bin".to_owned(), "junk".to_owned()];
        let (entrypoint, cmd) = (["/bin/sh".to_owned(), "-c".to_owned()], ["echo from-cmd".to_owned()]);
        let mut config = TaskConfig { env: vec![EnvVar::parse("B=task").unwrap()], ..Default::default() };
        config.apply_image(&image(&env, &entrypoint, &cmd), false).unwrap();
        let pairs: Vec<String> = config.env.iter().map(EnvVar::to_pair).collect();
        assert_eq!(pairs, ["A=image", "PATH=/image/bin", "B=task"], "image first, the task's on top, junk dropped");
        assert_eq!(config.workdir, "/srv/app");
        assert_eq!(config.user.as_deref(), Some("1000:1000"));
        assert_eq!(config.default_command(), ["/bin/sh", "-c", "echo from-cmd"]);

        // A workdir the task chose wins over the image's.
        let mut config = TaskConfig { workdir: "/tmp".into(), ..Default::default() };
        config.apply_image(&image(&[], &[], &[]), true).unwrap();
        assert_eq!(config.workdir, "/tmp");
        assert!(config.default_command().is_empty(), "no Entrypoint, no Cmd: no default command");

        // An image without a config leaves the task's defaults alone.
        let mut config = TaskConfig::default();
        config.apply_image(&ImageDefaults::default(), false).unwrap();
        assert_eq!(config, TaskConfig::default());
    }

    #[test]
    fn an_image_config_the_task_cannot_use_is_refused() {
        let mut config = TaskConfig::default();
        let relative = ImageDefaults { working_dir: Some("srv"), ..Default::default() };
        assert_eq!(config.apply_image(&relative, false), Err(Error::Workdir("srv".into())));
        // Positive control: the same image is fine when the task chose its workdir.
        assert_eq!(config.apply_image(&relative, true), Ok(()));
        let dotdot = ImageDefaults { working_dir: Some("/a/../b"), ..Default::default() };
        assert!(config.apply_image(&dotdot, false).is_err());
        let big = ImageDefaults { user: Some("70000"), ..Default::default() };
        assert_eq!(config.apply_image(&big, false), Err(Error::User("70000".into())));
    }

    #[test]
    fn users() {
        for good in ["0", "1000", "1000:1000", "65535:0", "app", "app:staff", "www-data", "1000:staff", "app:50"] {
            assert_eq!(check_user(good), Ok(()), "{good:?}");
        }
        for bad in ["", ":", "1000:", ":1000", "65536", "1:65536", "a:b:c", "a b", "a/b", "99999999999999999999"] {
            assert_eq!(check_user(bad), Err(Error::User(bad.into())), "{bad:?}");
        }
    }

    #[test]
    fn old_configs_load_without_the_image_fields() {
        let mut json = serde_json::to_value(TaskConfig::default()).unwrap();
        for key in ["user", "entrypoint", "cmd"] {
            assert!(json.get(key).is_none(), "{key} is left out when unset");
        }
        json["user"] = serde_json::json!("app");
        let read: TaskConfig = serde_json::from_value(json).unwrap();
        assert_eq!(read.user.as_deref(), Some("app"));
    }

    #[test]
    fn names_and_paths() {
        assert!(check_workdir("/workspace").is_ok());
        assert!(check_workdir("relative").is_err() && check_workdir("/a/../b").is_err());
        assert!(check_name("my-task_1").is_ok());
        assert!(check_name("").is_err() && check_name("a/b").is_err());
        assert!(check_name(TaskId::random().as_str()).is_err(), "a name must not look like an id");
        assert!(check_image_name("alpine-3.20").is_ok());
        assert!(check_image_name("../x").is_err() && check_image_name("UP").is_err() && check_image_name(".hidden").is_err());
        for good in [
            "python:3.12-slim",
            "library/python:3.12-slim",
            "127.0.0.1:5000/test/two:v1",
            "localhost/app:Latest_1.0",
            "Registry.Example.com/team/app",
            "a.very.long.name-with_parts",
            "test/two@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "test/two:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert!(check_image_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Team/app",
            "a//b",
            "a/../b",
            "a/.b",
            "/abs",
            "app:",
            "app:.x",
            "app:has space",
            "app@sha256:short",
            "app@sha256:0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF",
            "host:99999x/app",
            "app%2Fx",
        ] {
            assert!(check_image_name(bad).is_err(), "{bad}");
        }
        assert!(check_image_name(&"a".repeat(255)).is_ok() && check_image_name(&"a".repeat(256)).is_err());
    }
}
