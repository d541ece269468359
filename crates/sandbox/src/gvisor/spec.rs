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

    /// Removes what [`runsc_starts_a_sandbox_from_the_spec`] made, also when it fails.
    struct Lab {
        dir: tempfile::TempDir,
        netns: String,
        id: String,
    }

    impl Lab {
        fn runsc(&self) -> std::process::Command {
            let mut c = std::process::Command::new("runsc");
            c.arg("--root").arg(self.dir.path().join("state")).args(["--platform=ptrace", "--network=none"]);
            c
        }
    }

    impl Drop for Lab {
        fn drop(&mut self) {
            let _ = self.runsc().args(["delete", "-force", &self.id]).output();
            let _ = std::process::Command::new("ip").args(["netns", "delete", &self.netns]).output();
            // runsc removes the groups it made but not their parent; an
            // empty parent goes too (a sandbox still using it keeps it).
            let hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten().map(|h| h.path()).collect();
            for h in hierarchies.iter().chain([&PathBuf::from("/sys/fs/cgroup")]) {
                let _ = std::fs::remove_dir(h.join(CGROUP_PARENT).join(&self.id));
                let _ = std::fs::remove_dir(h.join(CGROUP_PARENT));
            }
        }
    }

    /// The spec is one runsc takes: a sandbox starts from it, joins the
    /// prepared namespace, sees only loopback, runs a command, and has the
    /// task's memory limit on its cgroup. Needs root and runsc (Debian's
    /// package, which scripts/setup-debian.sh installs).
    #[test]
    fn runsc_starts_a_sandbox_from_the_spec() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        let found = std::process::Command::new("runsc").arg("--version").output();
        assert!(found.is_ok_and(|o| o.status.success()), "runsc is missing: apt-get install runsc (scripts/setup-debian.sh does)");
        let id = format!("gvspec{:08x}", std::process::id());
        let lab = Lab { dir: tempfile::tempdir().unwrap(), netns: format!("cairn-{id}"), id: id.clone() };
        let out = std::process::Command::new("ip").args(["netns", "add", &lab.netns]).output().unwrap();
        assert!(out.status.success(), "ip netns add: {}", String::from_utf8_lossy(&out.stderr));
        let root = lab.dir.path().join("root");
        for d in ["bin", "proc", "dev", "sys", "tmp", "workspace", "run/cairn"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static (scripts/setup-debian.sh installs it)");
        for applet in ["sh", "sleep", "cat", "ip", "echo"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        let proxy = lab.dir.path().join("proxy");
        std::fs::create_dir_all(&proxy).unwrap();
        std::fs::write(proxy.join("marker"), "bound in\n").unwrap();
        let mut limits = Limits::default();
        limits.set_memory("128M").unwrap();
        let (init, env) = (vec!["/bin/sleep".to_owned(), "1000".to_owned()], vec!["PATH=/bin".to_owned()]);
        let netns = PathBuf::from("/run/netns").join(&lab.netns);
        let spec = SandboxSpec { task: &id, root: &root, init: &init, env: &env, workdir: "/workspace", limits: &limits, netns: &netns, proxy_dir: &proxy };
        let bundle = lab.dir.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        runtime_spec(&spec).unwrap().save(bundle.join("config.json")).unwrap();
        // Never piped: runsc's detached sandbox keeps the pipe open.
        let log = std::fs::File::create(lab.dir.path().join("run.log")).unwrap();
        let run = lab.runsc().args(["run", "-detach", "-bundle"]).arg(&bundle).arg(&id).stdout(log.try_clone().unwrap()).stderr(log).status().unwrap();
        assert!(run.success(), "runsc run: {}", std::fs::read_to_string(lab.dir.path().join("run.log")).unwrap_or_default());
        let exec = lab.runsc().args(["exec", &id, "/bin/sh", "-c", "pwd; cat /run/cairn/marker; ip -o link"]).output().unwrap();
        let said = String::from_utf8_lossy(&exec.stdout).into_owned();
        assert!(exec.status.success(), "runsc exec: {said}{}", String::from_utf8_lossy(&exec.stderr));
        assert!(said.starts_with("/workspace\nbound in\n"), "{said}");
        assert!(said.contains("lo") && said.lines().filter(|l| l.contains(": ")).count() == 1, "only loopback: {said}");
        let limit = std::fs::read_to_string(Path::new("/sys/fs/cgroup/memory").join(CGROUP_PARENT).join(&id).join("memory.limit_in_bytes"))
            .or_else(|_| std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(CGROUP_PARENT).join(&id).join("memory.max")))
            .expect("the sandbox's memory cgroup");
        assert_eq!(limit.trim(), (128u64 << 20).to_string());
    }
}

