//! The OCI runtime spec (`config.json`) that `runsc` starts a gvisor task's
//! sandbox from: the task's root overlay as it is on the host (writes go to
//! its writable layer, so snapshots see them as with the native driver),
//! the init bound in from the host, and the directory of the daemon's
//! egress socket. Limits are not in it: runsc is started inside the task's
//! cgroups, which Cairn made (`--ignore-cgroups`), as for a native sandbox.
//! docs/gvisor-notes.md says why each choice.

use std::path::Path;

use oci_spec::runtime::{
    LinuxBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, MountBuilder, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

use super::init::{EGRESS_DIR, INIT_DIR, INIT_SUBCOMMAND};
use crate::{Error, Result};

/// The host tasks of an idle sandbox (the sentry's threads, the gofer):
/// about 50 on the ptrace platform.
pub const SENTRY_PIDS: u32 = 256;

/// Host tasks per process inside, on the ptrace platform (its stub and the
/// sentry's threads that trace it): measured at about 23.
pub const HOST_TASKS_PER_PROCESS: u32 = 24;

/// The pids limit on the host for a task allowed `pids` processes: inside
/// the sandbox nothing counts processes for root, so the host's limit
/// (on the sentry's tasks) is what stops a fork bomb, at about `pids`
/// processes. Past it the sandbox dies whole; the host is untouched.
pub fn host_pids(pids: u32) -> u32 {
    pids.saturating_mul(HOST_TASKS_PER_PROCESS).saturating_add(SENTRY_PIDS)
}

/// The host's dynamic loader, bound in as `ld.so`: it runs `cairn` inside.
pub const LOADER: &str = "ld.so";

/// What the spec of one sandbox is made from.
#[derive(Debug)]
pub struct SandboxSpec<'a> {
    /// The task's root filesystem on the host (its overlay, mounted).
    pub root: &'a Path,
    pub workdir: &'a str,
    /// Host files bound read-only into [`INIT_DIR`], by name there: the
    /// loader ([`LOADER`]), its libraries and `cairn`.
    pub init_files: &'a [(String, std::path::PathBuf)],
    /// The host directory of the daemon's egress socket, bound read-only
    /// at [`EGRESS_DIR`].
    pub egress_dir: &'a Path,
}

fn spec_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Helper(format!("gvisor spec, {what}: {e}"))
}

fn bind(destination: String, source: &Path) -> Result<oci_spec::runtime::Mount> {
    MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(vec!["rbind".to_owned(), "ro".to_owned(), "nosuid".to_owned(), "nodev".to_owned()])
        .build()
        .map_err(|e| spec_error("mount", e))
}

/// The command line of `cairn <subcommand>` inside: the loader runs the
/// bound-in `cairn` with the libraries bound beside it.
pub fn cairn_args(subcommand: &str) -> Vec<String> {
    vec![
        format!("{INIT_DIR}/{LOADER}"),
        "--library-path".to_owned(),
        INIT_DIR.to_owned(),
        format!("{INIT_DIR}/cairn"),
        subcommand.to_owned(),
    ]
}

/// The capabilities of the sandbox's root: the native driver's bounded set
/// ([`crate::caps::SANDBOX_CAPS`]), which runsc applies to the init and to
/// every command.
pub fn sandbox_capabilities() -> Result<oci_spec::runtime::LinuxCapabilities> {
    let names = crate::caps::SANDBOX_CAPS.iter().map(|c| c.to_string());
    let set: oci_spec::runtime::Capabilities =
        names.map(|n| serde_json::from_value(serde_json::Value::String(n.clone())).map_err(|e| spec_error(&n, e))).collect::<Result<_>>()?;
    oci_spec::runtime::LinuxCapabilitiesBuilder::default()
        .bounding(set.clone())
        .effective(set.clone())
        .permitted(set)
        .inheritable(oci_spec::runtime::Capabilities::new())
        .ambient(oci_spec::runtime::Capabilities::new())
        .build()
        .map_err(|e| spec_error("capabilities", e))
}

/// No capability at all (a command of another user than root).
pub fn no_capabilities() -> Result<oci_spec::runtime::LinuxCapabilities> {
    let none = oci_spec::runtime::Capabilities::new();
    oci_spec::runtime::LinuxCapabilitiesBuilder::default()
        .bounding(sandbox_capabilities()?.bounding().clone().unwrap_or_default())
        .effective(none.clone())
        .permitted(none.clone())
        .inheritable(none.clone())
        .ambient(none)
        .build()
        .map_err(|e| spec_error("capabilities", e))
}

/// Builds the runtime spec of one sandbox.
pub fn runtime_spec(s: &SandboxSpec) -> Result<Spec> {
    let root = RootBuilder::default().path(s.root).readonly(false).build().map_err(|e| spec_error("root", e))?;
    let process = ProcessBuilder::default()
        .capabilities(sandbox_capabilities()?)
        .terminal(false)
        .user(UserBuilder::default().uid(0u32).gid(0u32).build().map_err(|e| spec_error("user", e))?)
        .args(cairn_args(INIT_SUBCOMMAND))
        .env(vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()])
        .cwd(s.workdir)
        .no_new_privileges(true)
        .build()
        .map_err(|e| spec_error("process", e))?;
    let namespaces = [LinuxNamespaceType::Pid, LinuxNamespaceType::Network, LinuxNamespaceType::Ipc, LinuxNamespaceType::Uts, LinuxNamespaceType::Mount]
        .into_iter()
        .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build().map_err(|e| spec_error("namespace", e)))
        .collect::<Result<Vec<_>>>()?;
    let linux = LinuxBuilder::default().namespaces(namespaces).build().map_err(|e| spec_error("linux", e))?;
    let mut mounts = oci_spec::runtime::get_default_mounts();
    for (name, source) in s.init_files {
        mounts.push(bind(format!("{INIT_DIR}/{name}"), source)?);
    }
    mounts.push(bind(EGRESS_DIR.to_owned(), s.egress_dir)?);
    SpecBuilder::default()
        .version("1.0.2")
        .root(root)
        .process(process)
        .hostname("cairn")
        .mounts(mounts)
        .linux(linux)
        .build()
        .map_err(|e| spec_error("spec", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> serde_json::Value {
        let init_files = vec![(LOADER.to_owned(), "/lib64/ld-linux-x86-64.so.2".into()), ("cairn".to_owned(), "/srv/cairn/bin/cairn".into())];
        let s = SandboxSpec {
            root: Path::new("/srv/cairn/run/t0123456789a/root"),
            workdir: "/workspace",
            init_files: &init_files,
            egress_dir: Path::new("/srv/cairn/run/t0123456789a/egress"),
        };
        serde_json::to_value(runtime_spec(&s).unwrap()).unwrap()
    }

    #[test]
    fn the_task_runs_on_its_overlay_with_the_init_from_the_host() {
        let v = spec();
        assert_eq!(v["root"], serde_json::json!({"path": "/srv/cairn/run/t0123456789a/root", "readonly": false}));
        assert_eq!(
            v["process"]["args"],
            serde_json::json!(["/dev/cairn/init/ld.so", "--library-path", "/dev/cairn/init", "/dev/cairn/init/cairn", "__gvisor-init"])
        );
        assert_eq!(v["process"]["cwd"], "/workspace");
        assert_eq!(v["process"]["noNewPrivileges"], true);
        // Limits are the cgroups runsc is started in (oci-spec's builder
        // may add its default device rule, which runsc ignores here).
        let resources = &v["linux"]["resources"];
        assert!(["memory", "cpu", "pids"].iter().all(|k| resources.get(k).is_none()), "{resources}");
        let caps = &v["process"]["capabilities"];
        let bounding: Vec<&str> = caps["bounding"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        assert_eq!(bounding.len(), crate::caps::SANDBOX_CAPS.len(), "{caps}");
        assert!(bounding.contains(&"CAP_CHOWN") && !bounding.contains(&"CAP_SYS_ADMIN"), "{caps}");
        assert_eq!(caps["effective"], caps["bounding"]);
        assert_eq!(caps["inheritable"], serde_json::json!([]));
        assert!(v["linux"].get("cgroupsPath").is_none());
    }

    #[test]
    fn host_files_are_bound_read_only_inside_dev_never_into_the_tasks_layer() {
        let v = spec();
        let mounts = v["mounts"].as_array().unwrap();
        let binds: Vec<_> = mounts.iter().filter(|m| m["type"] == "bind").collect();
        let dests: Vec<&str> = binds.iter().map(|m| m["destination"].as_str().unwrap()).collect();
        assert_eq!(dests, ["/dev/cairn/init/ld.so", "/dev/cairn/init/cairn", "/dev/cairn/egress"]);
        for m in &binds {
            let opts: Vec<&str> = m["options"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
            assert!(opts.contains(&"ro") && opts.contains(&"nosuid"), "{m}");
        }
        assert!(mounts.iter().any(|m| m["destination"] == "/dev" && m["type"] == "tmpfs"), "/dev is the sandbox's own tmpfs");
        assert!(mounts.iter().any(|m| m["destination"] == "/proc"), "the usual mounts stay");
        let ns = v["linux"]["namespaces"].as_array().unwrap();
        assert!(ns.iter().any(|n| n["type"] == "network") && ns.iter().all(|n| n.get("path").is_none()), "{ns:?}");
    }
}
