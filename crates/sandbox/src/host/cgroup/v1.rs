//! The cgroup v1 side: limits in the memory and cpu hierarchies, freezer.

use std::path::Path;

use super::{cpu_quota_us, invalid_data, read, wait_until, write, CPU_PERIOD_US, FREEZE_TIMEOUT};
use crate::{Error, Result};

/// Sets the memory limit, and the memory+swap limit to the same value when
/// swap accounting is on, so that swap cannot be used to get past it.
pub(super) fn set_memory(dir: &Path, bytes: u64) -> Result<()> {
    let mem = dir.join("memory.limit_in_bytes");
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let value = bytes.to_string();
    if !memsw.exists() {
        return write(&mem, &value);
    }
    // The kernel insists on memory <= memory+swap at every step, so when
    // raising a limit the memsw one goes first, and last when lowering it.
    let current: u64 = read(&mem)?.trim().parse().map_err(|_| invalid_data(&mem, "a byte count"))?;
    if bytes >= current {
        write(&memsw, &value)?;
        write(&mem, &value)
    } else {
        write(&mem, &value)?;
        write(&memsw, &value)
    }
}

pub(super) fn set_cpu(dir: &Path, millicpus: u32) -> Result<()> {
    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
    write(&dir.join("cpu.cfs_quota_us"), &cpu_quota_us(millicpus).to_string())
}

/// Freezes and waits until `freezer.state` reads `FROZEN`; it reads
/// `FREEZING` while some task has not stopped yet. Writing `FROZEN` again
/// makes the kernel retry the tasks that were not caught the first time.
pub(super) fn freeze(dir: &Path) -> Result<()> {
    let state = dir.join("freezer.state");
    let frozen = wait_until(FREEZE_TIMEOUT, || {
        write(&state, "FROZEN")?;
        Ok(read(&state)?.trim() == "FROZEN")
    })?;
    if frozen {
        return Ok(());
    }
    let _ = write(&state, "THAWED");
    Err(Error::CgroupTimeout(dir.to_owned(), "freeze"))
}

pub(super) fn thaw(dir: &Path) -> Result<()> {
    write(&dir.join("freezer.state"), "THAWED")
}
