//! What a destroyed task may leave on the host, looked for everywhere it
//! could be: processes, mounts, cgroups, loop devices, scratch files.
//! Used by the demo and the tests.

use std::path::Path;

/// Describes everything of `task` still on the host; empty when clean.
pub fn check(home: &Path, task: &str, init_pid: i32) -> Vec<String> {
    let mut found = Vec::new();
    if init_pid > 0 && Path::new(&format!("/proc/{init_pid}")).exists() {
        found.push(format!("process {init_pid} (the sandbox init) still exists"));
    }
    if let Ok(mi) = std::fs::read_to_string("/proc/self/mountinfo") {
        for l in mi.lines().filter(|l| l.contains(task)) {
            found.push(format!("mount: {l}"));
        }
    }
    for ctl in ["memory", "cpu", "pids", "freezer", "unified", ""] {
        let p = Path::new("/sys/fs/cgroup").join(ctl).join("cairn").join(task);
        if p.exists() {
            found.push(format!("cgroup {}", p.display()));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/block") {
        for e in entries.flatten() {
            if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
                if b.contains(task) {
                    found.push(format!("loop device {} backed by {}", e.file_name().to_string_lossy(), b.trim()));
                }
            }
        }
    }
    for p in [home.join("run").join(task), home.join("disks").join(format!("{task}.img"))] {
        if p.exists() {
            found.push(format!("scratch {}", p.display()));
        }
    }
    found
}
