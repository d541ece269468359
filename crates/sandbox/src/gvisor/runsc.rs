//! Calling `runsc`, gVisor's OCI runtime (Debian's package), for one
//! sandbox: run, restore, exec, checkpoint, delete. Each task has its own
//! state directory, so nothing of one task's is found by another's calls.
//! docs/gvisor-notes.md says why each flag is there.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The runsc platform: `kvm` where it works, else `ptrace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    Kvm,
    Ptrace,
}

impl Platform {
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Kvm => "kvm",
            Platform::Ptrace => "ptrace",
        }
    }
}

/// How long a probe of the KVM platform may take before it counts as
/// unusable (on some hosts `/dev/kvm` opens and makes VMs, and a sandbox
/// on it then never starts).
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The runsc executable, found on `PATH` or in the usual places.
pub fn find() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
}

/// Chooses the platform: KVM when `/dev/kvm` exists and a probe sandbox on
/// it runs `/bin/true` (from the host's root, read-only) in time, else
/// ptrace. The probe runs in the cgroup `probe` (made and removed by the
/// caller), so that everything it started dies with it, and keeps its
/// state in `scratch`, which is removed after.
pub fn detect_platform(runsc: &Path, scratch: &Path, probe: &crate::host::cgroup::TaskCgroup) -> Platform {
    if !Path::new("/dev/kvm").exists() {
        return Platform::Ptrace;
    }
    let works = probe_kvm(runsc, scratch, probe).unwrap_or(false);
    if probe.exists() {
        let _ = probe.kill_all();
    }
    let _ = std::fs::remove_dir_all(scratch);
    if works {
        Platform::Kvm
    } else {
        Platform::Ptrace
    }
}

fn probe_kvm(runsc: &Path, scratch: &Path, probe: &crate::host::cgroup::TaskCgroup) -> std::io::Result<bool> {
    let bundle = scratch.join("bundle");
    std::fs::create_dir_all(&bundle)?;
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "root": { "path": "/", "readonly": true },
        "process": { "args": ["/bin/true"], "cwd": "/", "user": { "uid": 0, "gid": 0 } },
        "mounts": [{ "destination": "/proc", "type": "proc", "source": "proc" }],
        "linux": { "namespaces": [{ "type": "pid" }, { "type": "network" }, { "type": "mount" }] },
    });
    std::fs::write(bundle.join("config.json"), spec.to_string())?;
    let procs: Vec<std::path::PathBuf> = probe.paths().iter().map(|p| p.join("cgroup.procs")).collect();
    let mut cmd = Command::new(runsc);
    cmd.arg("--root")
        .arg(scratch.join("state"))
        .args(["--platform=kvm", "--network=none", "--ignore-cgroups", "run", "-bundle"])
        .arg(&bundle)
        .arg("kvmprobe")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    join_cgroups_on_exec(&mut cmd, &procs)?;
    // Its control socket exists only in a namespace that ends with it.
    super::netns::unshare_on_exec(&mut cmd);
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + KVM_PROBE_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.success());
        }
        if Instant::now() >= deadline {
            let _ = probe.kill_all();
            let _ = child.wait();
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes the command join the cgroups whose `cgroup.procs` files are
/// `procs` before it runs, so that it and everything it starts (a
/// sandbox's sentry and gofer) are there, in every hierarchy.
pub fn join_cgroups_on_exec(cmd: &mut Command, procs: &[std::path::PathBuf]) -> std::io::Result<()> {
    let files: Vec<std::ffi::CString> = procs.iter().map(|p| cairn_fsat::cstr(p.as_os_str())).collect::<std::io::Result<_>>()?;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe calls (open, write, close) on data prepared
    // before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for f in &files {
                let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(())
}

/// runsc for one sandbox, whose state lives in `state`.
#[derive(Clone, Debug)]
pub struct Runsc {
    pub exe: PathBuf,
    pub platform: Platform,
    pub state: PathBuf,
    /// The pin of the task's network namespace, where every call runs.
    pub netns: PathBuf,
}

impl Runsc {
    /// The command with the flags every call of one sandbox must agree on.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.exe);
        c.arg("--root")
            .arg(&self.state)
            .arg(format!("--platform={}", self.platform.as_str()))
            // No network device: checkpoints need it, and the proxy comes
            // in over a unix socket (see `egress`).
            .arg("--network=none")
            .arg("--host-uds=open")
            // The daemon writes into the root while the sandbox runs (cp),
            // and restores over a root rebuilt from a snapshot.
            .arg("--file-access=shared")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null());
        super::netns::join_on_exec(&mut c, &self.netns);
        c
    }

}

/// Starts the sandbox `id` from `bundle` with `c` (a [`Runsc::command`]),
/// or restores it from the checkpoint in `image` (a directory). The output
/// goes to `log`: a detached sandbox keeps a pipe open forever.
pub fn start_with(mut c: Command, id: &str, bundle: &Path, image: Option<&Path>, log: &Path) -> Result<()> {
    {
        let out = File::create(log).map_err(|e| Error::Io(log.display().to_string(), e))?;
        let err = out.try_clone().map_err(|e| Error::Io(log.display().to_string(), e))?;
        match image {
            None => c.args(["run", "-detach", "-bundle"]).arg(bundle),
            Some(dir) => c.args(["restore", "-detach", "-bundle"]).arg(bundle).arg("-image-path").arg(dir),
        };
        let status = c.arg(id).stdout(out).stderr(err).status().map_err(|e| Error::Helper(format!("cannot run runsc: {e}")))?;
        if !status.success() {
            let said = std::fs::read_to_string(log).unwrap_or_default();
            let what = if image.is_some() { "restore" } else { "run" };
            return Err(Error::Helper(format!("runsc {what} failed ({status}): {}", last_line(&said))));
        }
        Ok(())
    }
}

impl Runsc {
    /// Checkpoints the sandbox's processes and memory into `image` (a
    /// directory); the sandbox stops.
    pub fn checkpoint(&self, id: &str, image: &Path) -> Result<()> {
        let out = self.command().args(["checkpoint", "-image-path"]).arg(image).arg(id).output().map_err(|e| Error::Helper(format!("cannot run runsc: {e}")))?;
        if !out.status.success() {
            return Err(Error::Helper(format!("runsc checkpoint failed ({}): {}", out.status, last_line(&String::from_utf8_lossy(&out.stderr)))));
        }
        Ok(())
    }

    /// The host pid of the sandbox's init (its sentry), from `runsc state`.
    pub fn sandbox_pid(&self, id: &str) -> Result<i32> {
        let out = self.command().args(["state", id]).output().map_err(|e| Error::Helper(format!("cannot run runsc: {e}")))?;
        if !out.status.success() {
            return Err(Error::NotRunning(id.to_owned()));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| Error::Protocol(format!("runsc state: {e}")))?;
        if v["status"] != "running" {
            return Err(Error::NotRunning(format!("{id} ({})", v["status"])));
        }
        v["pid"].as_i64().map(|p| p as i32).ok_or_else(|| Error::Protocol("runsc state has no pid".into()))
    }
}

fn last_line(s: &str) -> String {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_owned()
}
