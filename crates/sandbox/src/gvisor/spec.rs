//! The OCI runtime spec (`config.json`) that `runsc` starts a gvisor task's
//! sandbox from: the task's root overlay as it is on the host (writes go to
//! its writable layer, so snapshots see them as with the native driver),
//! the task's limits as cgroup limits under Cairn's own cgroup path, and
//! the network namespace the daemon prepared for it (runsc is called from
//! the host's namespace: its control socket belongs to the namespace it is
//! called in). docs/gvisor-notes.md says why each choice.

use std::path::{Path, PathBuf};

use cairn_core::Limits;
use oci_spec::runtime::{
    LinuxBuilder, LinuxCpuBuilder, LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder,
    LinuxResourcesBuilder, MountBuilder, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use crate::{Error, Result};

/// The cgroup directory every gvisor sandbox's groups are under (runsc
/// would otherwise make `/<container id>` in every hierarchy).
pub const CGROUP_PARENT: &str = "cairn-gvisor";

/// runsc's own threads and ptrace stubs count against the pids limit (25
/// when idle): the limit the host enforces is the task's plus this, so
/// that a sandbox is not killed for the sentry's threads.
pub const SENTRY_PIDS: i64 = 256;

/// What the spec of one sandbox is made from.
#[derive(Debug)]
pub struct SandboxSpec<'a> {
    pub task: &'a str,
    /// The task's root filesystem on the host (its overlay, mounted).
    pub root: &'a Path,
    /// The sandbox's first process and its arguments.
    pub init: &'a [String],
    pub env: &'a [String],
    pub workdir: &'a str,
    pub limits: &'a Limits,
    /// The network namespace prepared for the sandbox (only loopback).
    pub netns: &'a Path,
    /// A host directory bound at `/run/cairn` inside, for the egress
    /// proxy's socket.
    pub proxy_dir: &'a Path,
}

fn spec_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Helper(format!("gvisor spec, {what}: {e}"))
}

/// The cgroup path of a task's sandbox, relative to each hierarchy's root.
pub fn cgroup_path(task: &str) -> PathBuf {
    Path::new("/").join(CGROUP_PARENT).join(task)
}

/// Builds the runtime spec of one sandbox.
pub fn runtime_spec(s: &SandboxSpec) -> Result<Spec> {
    let root = RootBuilder::default().path(s.root).readonly(false).build().map_err(|e| spec_error("root", e))?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(UserBuilder::default().uid(0u32).gid(0u32).build().map_err(|e| spec_error("user", e))?)
        .args(s.init.to_vec())
        .env(s.env.to_vec())
        .cwd(s.workdir)
        .no_new_privileges(true)
        .build()
        .map_err(|e| spec_error("process", e))?;
    let memory = LinuxMemoryBuilder::default().limit(s.limits.memory_bytes as i64).build().map_err(|e| spec_error("memory", e))?;
    // A period of 100 ms, as the native driver's CFS settings.
    let cpu = LinuxCpuBuilder::default()
        .quota(i64::from(s.limits.millicpus) * 100)
        .period(100_000u64)
        .build()
        .map_err(|e| spec_error("cpu", e))?;
    let pids = LinuxPidsBuilder::default().limit(i64::from(s.limits.pids) + SENTRY_PIDS).build().map_err(|e| spec_error("pids", e))?;
    let resources = LinuxResourcesBuilder::default().memory(memory).cpu(cpu).pids(pids).build().map_err(|e| spec_error("resources", e))?;
    let namespaces = [
        (LinuxNamespaceType::Pid, None),
        (LinuxNamespaceType::Network, Some(s.netns)),
        (LinuxNamespaceType::Ipc, None),
        (LinuxNamespaceType::Uts, None),
        (LinuxNamespaceType::Mount, None),
    ]
    .into_iter()
    .map(|(typ, path)| {
        let b = LinuxNamespaceBuilder::default().typ(typ);
        match path {
            Some(p) => b.path(p).build(),
            None => b.build(),
        }
        .map_err(|e| spec_error("namespace", e))
    })
    .collect::<Result<Vec<_>>>()?;
    let linux = LinuxBuilder::default()
        .cgroups_path(cgroup_path(s.task))
        .resources(resources)
        .namespaces(namespaces)
        .build()
        .map_err(|e| spec_error("linux", e))?;
    let mut mounts = oci_spec::runtime::get_default_mounts();
    mounts.push(
        MountBuilder::default()
            .destination("/run/cairn")
            .typ("bind")
            .source(s.proxy_dir)
            .options(vec!["rbind".to_owned(), "rw".to_owned()])
            .build()
            .map_err(|e| spec_error("mount", e))?,
    );
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

    fn spec_of(limits: &Limits) -> serde_json::Value {
        let init = vec!["/run/cairn/init".to_owned()];
        let env = vec!["PATH=/usr/bin:/bin".to_owned()];
        let s = SandboxSpec {
            task: "t0123456789a",
            root: Path::new("/srv/cairn/run/t0123456789a/root"),
            init: &init,
            env: &env,
            workdir: "/workspace",
            limits,
            netns: Path::new("/run/netns/cairn-t0123456789a"),
            proxy_dir: Path::new("/srv/cairn/run/t0123456789a/proxy"),
        };
        serde_json::to_value(runtime_spec(&s).unwrap()).unwrap()
    }

    #[test]
    fn the_task_runs_on_its_overlay_with_its_limits_under_cairns_cgroup() {
        let mut limits = Limits::default();
        limits.set_memory("256M").unwrap();
        limits.set_cpus("1.5").unwrap();
        limits.set_pids("64").unwrap();
        let v = spec_of(&limits);
        assert_eq!(v["root"], serde_json::json!({"path": "/srv/cairn/run/t0123456789a/root", "readonly": false}));
        assert_eq!(v["process"]["args"], serde_json::json!(["/run/cairn/init"]));
        assert_eq!(v["process"]["cwd"], "/workspace");
        assert_eq!(v["process"]["noNewPrivileges"], true);
        assert_eq!(v["linux"]["cgroupsPath"], "/cairn-gvisor/t0123456789a");
        let r = &v["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], 256 << 20);
        assert_eq!((r["cpu"]["quota"].as_i64(), r["cpu"]["period"].as_u64()), (Some(150_000), Some(100_000)));
        assert_eq!(r["pids"]["limit"], 64 + SENTRY_PIDS, "the sentry's own threads on top of the task's");
    }

    #[test]
    fn the_network_is_the_prepared_namespace_and_the_proxy_socket_is_bound_in() {
        let v = spec_of(&Limits::default());
        let ns = v["linux"]["namespaces"].as_array().unwrap();
        let net: Vec<_> = ns.iter().filter(|n| n["type"] == "network").collect();
        assert_eq!(net.len(), 1);
        assert_eq!(net[0]["path"], "/run/netns/cairn-t0123456789a", "joined, not a new one");
        assert!(ns.iter().filter(|n| n["type"] != "network").all(|n| n.get("path").is_none()), "the others are new: {ns:?}");
        let mounts = v["mounts"].as_array().unwrap();
        let bound: Vec<_> = mounts.iter().filter(|m| m["destination"] == "/run/cairn").collect();
        assert_eq!(bound.len(), 1, "{mounts:?}");
        assert_eq!((bound[0]["type"].as_str(), bound[0]["source"].as_str()), (Some("bind"), Some("/srv/cairn/run/t0123456789a/proxy")));
        assert!(mounts.iter().any(|m| m["destination"] == "/proc"), "the usual mounts stay");
    }
}
