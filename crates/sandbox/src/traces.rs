//! What a task may leave on the host, looked for everywhere it could be:
//! its init process, mounts, cgroups, loop devices, scratch files and
//! named network namespaces. Empty after a destroy; the demo and the tests
//! check exactly that.

use std::path::Path;
use std::process::Command;

use crate::host::cgroup::CgroupLayout;

/// Describes everything of `task` (home `home`, init `init_pid` when known)
/// still on the host; empty when clean.
pub fn host_traces(home: &Path, task: &str, init_pid: i32) -> Vec<String> {
    let mut found = Vec::new();
    if init_pid > 0 && Path::new(&format!("/proc/{init_pid}")).exists() {
        found.push(format!("process {init_pid} (the sandbox init) still exists"));
    }
    // A gvisor sandbox's sentry and gofer name the task's runsc state
    // directory on their command lines.
    let state = home.join("run").join(task).join("runsc");
    let state = state.to_string_lossy();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(state.as_ref()) {
                found.push(format!("process {} (runsc of the task) still exists", e.file_name().to_string_lossy()));
            }
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    found.extend(mountinfo.lines().filter(|l| l.contains(task)).map(|l| format!("mount: {l}")));
    match CgroupLayout::detect().and_then(|layout| layout.open(task)) {
        Ok(group) => found.extend(group.paths().into_iter().filter(|p| p.exists()).map(|p| format!("cgroup {}", p.display()))),
        Err(e) => found.push(format!("cannot look for cgroups: {e}")),
    }
    for e in std::fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
            if b.contains(task) {
                found.push(format!("loop device {} backed by {}", e.file_name().to_string_lossy(), b.trim()));
            }
        }
    }
    for p in [home.join("run").join(task), home.join("disks").join(format!("{task}.img"))] {
        if p.exists() {
            found.push(format!("scratch {}", p.display()));
        }
    }
    // `ip netns` lists named namespaces; Cairn creates none, so any that
    // names the task is a leak.
    if let Ok(o) = Command::new("ip").args(["netns", "list"]).output() {
        let s = String::from_utf8_lossy(&o.stdout);
        if s.contains(task) {
            found.push(format!("netns {}", s.trim()));
        }
    }
    found
}
