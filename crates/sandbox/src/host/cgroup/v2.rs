//! The cgroup2 side: controller delegation, limits, freezer.

use std::io;
use std::path::Path;

use cairn_core::Limits;

use super::{cpu_quota_us, mkdir, read, wait_until, write, CPU_PERIOD_US, FREEZE_TIMEOUT, PARENT};
use crate::{Error, Result};

/// The controllers a task group needs, in the order they are enabled.
const WANTED: [&str; 3] = ["memory", "cpu", "pids"];

/// The wanted controllers the hierarchy offers. Detection has already made
/// sure memory is among them.
fn enabled(available: &[String]) -> Vec<&'static str> {
    WANTED.into_iter().filter(|c| available.iter().any(|a| a == c)).collect()
}

/// Makes `<root>/cairn` and enables the controllers for it and for its
/// children: a controller is only usable in a group if its parent lists it
/// in `cgroup.subtree_control`.
pub(super) fn prepare_parent(root: &Path, available: &[String]) -> Result<()> {
    let controllers = enabled(available);
    for missing in WANTED.iter().filter(|c| !controllers.contains(c)) {
        tracing::warn!(
            root = %root.display(),
            "cgroup2 does not offer the {missing} controller; tasks run without a {missing} limit"
        );
    }
    enable(root, &controllers)?;
    let parent = root.join(PARENT);
    mkdir(&parent)?;
    // `cairn` itself never holds processes, so enabling controllers for its
    // children does not run into the "no internal processes" rule.
    enable(&parent, &controllers)
}

/// Writes `+ctrl` for each controller not yet in `dir`'s subtree_control.
/// Skipping the write when nothing is missing keeps a repeated create from
/// touching the host's root group at all.
fn enable(dir: &Path, controllers: &[&str]) -> Result<()> {
    let file = dir.join("cgroup.subtree_control");
    let current = read(&file)?;
    let missing: Vec<String> = controllers
        .iter()
        .filter(|c| !current.split_whitespace().any(|on| on == **c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    write(&file, &missing.join(" ")).map_err(|e| match e {
        // The "no internal processes" rule: only the real root may have
        // processes of its own and still delegate controllers. This is what
        // happens when the daemon runs in a container's cgroup namespace.
        Error::Cgroup(path, err) if err.raw_os_error() == Some(libc::EBUSY) => {
            let why = format!(
                "{err}: {} holds processes itself, so it cannot enable controllers for child groups; \
                 move its processes into a child group first",
                dir.display()
            );
            Error::Cgroup(path, io::Error::new(err.kind(), why))
        }
        e => e,
    })
}

pub(super) fn apply_limits(dir: &Path, available: &[String], limits: &Limits) -> Result<()> {
    let controllers = enabled(available);
    // Detection refuses a hierarchy without memory, so this always runs.
    if controllers.contains(&"memory") {
        write(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
        // Present only with swap accounting. Without this a task could keep
        // running past memory.max by swapping.
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write(&swap, "0")?;
        }
    }
    if controllers.contains(&"cpu") {
        write(&dir.join("cpu.max"), &format!("{} {CPU_PERIOD_US}", cpu_quota_us(limits.millicpus)))?;
    }
    if controllers.contains(&"pids") {
        write(&dir.join("pids.max"), &limits.pids.to_string())?;
    }
    Ok(())
}

/// Freezes and waits until `cgroup.events` reports `frozen 1`: writing
/// `cgroup.freeze` only starts the freeze.
pub(super) fn freeze(dir: &Path) -> Result<()> {
    write(&dir.join("cgroup.freeze"), "1")?;
    let events = dir.join("cgroup.events");
    let frozen = wait_until(FREEZE_TIMEOUT, || Ok(read(&events)?.lines().any(|l| l.trim() == "frozen 1")))?;
    if frozen {
        return Ok(());
    }
    // Do not leave a half-frozen group behind.
    let _ = write(&dir.join("cgroup.freeze"), "0");
    Err(Error::CgroupTimeout(dir.to_owned(), "freeze"))
}

pub(super) fn thaw(dir: &Path) -> Result<()> {
    write(&dir.join("cgroup.freeze"), "0")
}
