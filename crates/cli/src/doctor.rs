//! `cairn doctor`: whether this host has what Cairn needs, checked where an
//! operator would look, each finding with what to do about it. Runs
//! without the daemon (and asks it how it is when one runs); exits 1 when
//! something Cairn cannot work without is missing.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Serialize)]
struct Finding {
    check: &'static str,
    level: Level,
    detail: String,
}

fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding { check, level: Level::Ok, detail: detail.into() }
}

fn warn(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding { check, level: Level::Warn, detail: detail.into() }
}

fn fail(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding { check, level: Level::Fail, detail: detail.into() }
}

/// Free space under which the disk check warns, and fails.
const DISK_WARN: u64 = 5 << 30;
const DISK_FAIL: u64 = 1 << 30;

/// The oldest kernel with what the daemon relies on (`openat2`, 5.6).
const KERNEL_MIN: (u32, u32) = (5, 6);

fn kernel() -> Finding {
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if version >= KERNEL_MIN {
        ok("kernel", format!("Linux {release}"))
    } else {
        fail("kernel", format!("Linux {release}: Cairn needs {}.{} or later (openat2)", KERNEL_MIN.0, KERNEL_MIN.1))
    }
}

fn user_namespaces() -> Finding {
    match std::fs::read_to_string("/proc/sys/user/max_user_namespaces").map(|s| s.trim().parse::<u64>().unwrap_or(0)) {
        Ok(n) if n > 0 => ok("user namespaces", format!("up to {n}")),
        Ok(_) => fail("user namespaces", "user.max_user_namespaces is 0: sandboxes need them (sysctl -w user.max_user_namespaces=15000)"),
        Err(e) => fail("user namespaces", format!("cannot read /proc/sys/user/max_user_namespaces: {e}")),
    }
}

fn overlay() -> Finding {
    let listed = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if listed.lines().any(|l| l.split_whitespace().last() == Some("overlay")) {
        ok("overlayfs", "available")
    } else if Path::new("/sys/module/overlay").exists() || has_module("overlay") {
        ok("overlayfs", "available as a module")
    } else {
        fail("overlayfs", "not in /proc/filesystems: a task's root is an overlay (modprobe overlay)")
    }
}

fn has_module(name: &str) -> bool {
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    std::fs::read_to_string(format!("/lib/modules/{release}/modules.dep")).is_ok_and(|deps| deps.lines().any(|l| l.contains(&format!("/{name}.ko"))))
}

fn cgroups() -> Finding {
    use cairn_sandbox::inspect::{CgroupLayout, CgroupVersion};
    // The daemon's own detection: what it finds is what it will use.
    match CgroupLayout::detect() {
        Ok(layout) => {
            let version = match layout.version() {
                CgroupVersion::V2 => "v2 (unified): memory, cpu and pids in one hierarchy",
                CgroupVersion::V1 => "v1 (legacy or hybrid): memory, cpu and pids hierarchies",
            };
            ok("cgroups", version)
        }
        Err(e) => fail("cgroups", format!("{e}: a task's memory, cpu and pids limits need them")),
    }
}

fn seccomp() -> Finding {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if status.lines().any(|l| l.starts_with("Seccomp:")) {
        ok("seccomp", "available")
    } else {
        fail("seccomp", "the kernel has no seccomp (CONFIG_SECCOMP_FILTER): sandboxes filter system calls")
    }
}

fn loop_devices() -> Finding {
    if Path::new("/dev/loop-control").exists() {
        ok("loop devices", "/dev/loop-control")
    } else {
        fail("loop devices", "no /dev/loop-control: each task's disk is a loop device (modprobe loop)")
    }
}

fn openat2() -> Finding {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    const RESOLVE_BENEATH: u64 = 0x08;
    let how = OpenHow { flags: (libc::O_PATH | libc::O_CLOEXEC) as u64, mode: 0, resolve: RESOLVE_BENEATH };
    let root = match std::fs::File::open("/") {
        Ok(f) => f,
        Err(e) => return fail("openat2", format!("cannot open /: {e}")),
    };
    // SAFETY: the directory descriptor is open for the call, the path a
    // NUL-terminated literal and `how` a live open_how of the size passed;
    // the descriptor returned is closed below.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, std::os::fd::AsRawFd::as_raw_fd(&root), c".".as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    };
    if fd >= 0 {
        // SAFETY: fd was just opened here and is closed once.
        unsafe { libc::close(fd as i32) };
        ok("openat2", "RESOLVE_BENEATH works (the daemon walks sandbox trees with it)")
    } else {
        fail("openat2", format!("openat2 failed ({}): the daemon never opens a sandbox's path without it", std::io::Error::last_os_error()))
    }
}

fn runsc() -> Finding {
    let Some(path) = cairn_sandbox::find_runsc() else {
        return warn("gVisor", "runsc not found: --isolation gvisor is unavailable (scripts/setup-debian.sh installs it)");
    };
    let out = std::process::Command::new(&path).arg("--version").stdin(std::process::Stdio::null()).output();
    match out {
        Ok(o) if o.status.success() => {
            let first = String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().to_owned();
            ok("gVisor", format!("{} ({first})", path.display()))
        }
        Ok(o) => warn("gVisor", format!("{} --version failed ({})", path.display(), o.status)),
        Err(e) => warn("gVisor", format!("cannot run {}: {e}", path.display())),
    }
}

/// The nearest existing directory at or above `path`.
fn existing(path: &Path) -> &Path {
    path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"))
}

fn disk(home: &Path) -> Finding {
    let at = existing(home);
    match nix::sys::statvfs::statvfs(at) {
        Ok(s) => {
            let free = s.blocks_available() * s.fragment_size();
            let shown = format!("{:.1} GiB free under {}", free as f64 / (1u64 << 30) as f64, at.display());
            if free < DISK_FAIL {
                fail("disk room", format!("{shown}: task disks, snapshots and images need room (at least 1 GiB)"))
            } else if free < DISK_WARN {
                warn("disk room", format!("{shown}: less than 5 GiB"))
            } else {
                ok("disk room", shown)
            }
        }
        Err(e) => fail("disk room", format!("cannot read the filesystem of {}: {e}", at.display())),
    }
}

fn home_permissions(home: &Path) -> Finding {
    let Ok(meta) = std::fs::symlink_metadata(home) else {
        return ok("home", format!("{} does not exist yet (the daemon makes it, 0700)", home.display()));
    };
    if !meta.is_dir() {
        return fail("home", format!("{} is not a directory", home.display()));
    }
    let mode = meta.mode() & 0o777;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        warn("home", format!("{} belongs to uid {}, not to uid {me} who runs this", home.display(), meta.uid()))
    } else if mode & 0o077 != 0 {
        warn("home", format!("{} is {mode:o}: others may read it (the daemon makes it 0700 at start)", home.display()))
    } else {
        ok("home", format!("{} ({mode:o})", home.display()))
    }
}

fn clock() -> Finding {
    // SAFETY: timex is plain data; zeroed with modes 0 it only asks.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: tx is a valid, writable timex.
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state == libc::TIME_ERROR {
        warn("clock", "not synchronised (NTP): approval links, webhook timestamps and leases rely on it")
    } else if state < 0 {
        warn("clock", format!("cannot ask the kernel ({})", std::io::Error::last_os_error()))
    } else {
        ok("clock", "synchronised")
    }
}

async fn daemon(home: &Path) -> Finding {
    let Ok(url) = std::fs::read_to_string(home.join("url")) else {
        return ok("daemon", format!("not running on {}", home.display()));
    };
    let url = url.trim().to_owned();
    let token = std::fs::read_to_string(home.join("token")).unwrap_or_default();
    let http = match reqwest::Client::builder().timeout(Duration::from_secs(5)).build() {
        Ok(c) => c,
        Err(e) => return warn("daemon", format!("cannot make an HTTP client: {e}")),
    };
    match http.get(format!("{url}/v1/health")).bearer_auth(token.trim()).send().await {
        Ok(r) if r.status().is_success() => {
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            ok("daemon", format!("running at {url} (version {})", v["version"].as_str().unwrap_or("?")))
        }
        Ok(r) => warn("daemon", format!("{url} answered {}", r.status())),
        Err(_) => warn("daemon", format!("{url} does not answer (a daemon that stopped without removing its url file?)")),
    }
}

pub(crate) async fn run(home: &Path, json: bool) -> Result<u8> {
    let mut findings = vec![kernel(), user_namespaces(), overlay(), cgroups(), seccomp(), loop_devices(), openat2(), runsc(), disk(home), home_permissions(home), clock()];
    findings.push(daemon(home).await);
    if json {
        outln!("{}", serde_json::to_string_pretty(&findings).unwrap_or_default());
    } else {
        for f in &findings {
            let tag = match f.level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            outln!("{tag}  {:<16} {}", f.check, f.detail);
        }
    }
    let failed = findings.iter().filter(|f| f.level == Level::Fail).count();
    Ok(if failed > 0 { 1 } else { 0 })
}
