//! What a sandbox cannot reach, each denial next to a positive control that
//! shows the same probe works where it should (on the host, in the task
//! itself, or under a higher limit).
//!
//! scripts/test.sh runs this file twice: on the native driver, and with
//! `CAIRN_TEST_ISOLATION=gvisor`. Where the gvisor driver gets the same
//! property another way (a second kernel instead of a user namespace, the
//! sandbox's limits on its sentry), the test checks that way instead; the
//! differences are in docs/security.md, "The gvisor driver".

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_sandbox::inspect::{CgroupLayout, CgroupVersion};
use common::{cgroup_file, task_cgroup, under_gvisor, Daemon};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A random lowercase hex string, for names no other run uses.
fn rand_hex() -> String {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    assert_eq!(n, 8, "getrandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Removes the host paths it holds when dropped, also when a test fails.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir_all(p);
                }
                Ok(_) => {
                    let _ = std::fs::remove_file(p);
                }
                Err(_) => {}
            }
        }
    }
}

/// `sh -c SCRIPT` on the host: (exit code, stdout, stderr).
fn host_sh(script: &str) -> (i32, String, String) {
    let out = common::run(Command::new("sh").args(["-c", script])).expect("run sh on the host");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `cairn --json exec ID -- sh -c SCRIPT`: (exit object, the command's
/// stdout before it, stderr).
fn exec_json(d: &Daemon, id: &str, script: &str) -> (Value, String, String) {
    let out = d.cairn(&["--json", "exec", id, "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let trimmed = stdout.trim_end();
    let (before, last) = trimmed.rsplit_once('\n').unwrap_or(("", trimmed));
    let exit: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("no exit object in {stdout:?} ({e}); stderr {stderr:?}"));
    assert_eq!(exit["type"], "exit", "{exit}");
    assert_eq!(
        exit["exit_code"].as_i64(),
        out.status.code().map(i64::from),
        "cairn exec exits with the command's code: {exit}"
    );
    (exit, before.to_owned(), stderr)
}

/// Runs a script that must succeed in the task; returns its stdout.
fn sh_ok(d: &Daemon, id: &str, script: &str) -> String {
    let (code, out, err) = d.sh(id, script);
    assert_eq!(code, 0, "{script:?} failed in {id}: stdout {out:?} stderr {err:?}");
    out
}

fn init_pid(d: &Daemon, id: &str) -> i32 {
    d.task(id)["sandbox_pid"].as_i64().expect("a running task has a sandbox pid") as i32
}

/// Destroys `id` and checks that nothing of it is left on the host.
fn destroy_clean(d: &Daemon, id: &str) {
    let pid = init_pid(d, id);
    d.ok(&["destroy", id]);
    assert_eq!(d.leftovers(id, pid), Vec::<String>::new(), "task {id} left things behind");
}

/// Every entry under `root` with its type, size, mode, owner and mtime.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, u64, u32, u32, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())).flatten() {
            let m = std::fs::symlink_metadata(e.path()).expect("stat");
            if m.is_dir() {
                stack.push(e.path());
            }
            let rel = e.path().strip_prefix(root).expect("under root").to_owned();
            out.insert(rel, (m.mode(), m.len(), m.uid(), m.gid(), m.mtime(), m.mtime_nsec()));
        }
    }
    out
}

/// Free bytes on the filesystem holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs is plain old data; the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs {}", path.display());
    st.f_bavail * st.f_frsize
}

/// Interface names in `ip -o link` output.
fn link_names(ip_output: &str) -> Vec<String> {
    ip_output
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).trim().to_owned())
        .collect()
}

/// Whether this host lets root lower an OOM score (CAP_SYS_RESOURCE in
/// its effective set): the sandbox's init then runs at -1000.
fn host_may_lower_oom_scores() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").expect("own status");
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).expect("CapEff");
    u64::from_str_radix(eff.trim(), 16).expect("a capability mask") & (1 << CAP_SYS_RESOURCE) != 0
}

fn daemon_port(d: &Daemon) -> u16 {
    let url = std::fs::read_to_string(d.home().join("url")).expect("url file");
    url.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no port in {url:?}"))
}

#[test]
fn host_files_outside_the_image_are_invisible() {
    common::require_root();
    let tag = rand_hex();
    let mut guard = RemoveOnDrop(Vec::new());
    // The host image leaves machine-id out; make sure the host has one to
    // leave out before the daemon builds its image.
    let machine_id = Path::new("/etc/machine-id");
    if !machine_id.exists() {
        guard.0.push(machine_id.to_owned());
        std::fs::write(machine_id, format!("{tag}{tag}\n")).expect("create a temporary /etc/machine-id");
    }
    for secret in ["/etc/shadow", "/etc/gshadow", "/etc/machine-id"] {
        assert!(Path::new(secret).exists(), "host has no {secret}: the test needs it present on the host to show it is absent inside");
    }
    let root_probe = PathBuf::from(format!("/root/cairn-isolation-probe-{tag}"));
    let user_dir = PathBuf::from(format!("/home/cairn-iso-{tag}"));
    guard.0.push(root_probe.clone());
    guard.0.push(user_dir.clone());
    std::fs::write(&root_probe, "root's private data\n").expect("write probe in /root");
    std::fs::create_dir(&user_dir).expect("create fake user home");
    std::fs::write(user_dir.join("notes.txt"), "another user's data\n").expect("write user data");
    assert!(root_probe.exists() && user_dir.join("notes.txt").exists(), "probes exist on the host");

    let d = Daemon::start();
    let token_path = d.home().join("token");
    let token = std::fs::read_to_string(&token_path).expect("token file").trim().to_owned();
    assert_eq!(token.len(), 64, "token {token:?}");
    let home_name = d.home().file_name().expect("home has a name").to_string_lossy().into_owned();
    assert!(Path::new("/var/tmp").join(&home_name).exists(), "the daemon's home is in the host's /var/tmp");
    let id = d.create(&[]);

    // /root and /home are empty inside; the probes are not there.
    let out = sh_ok(&d, &id, "ls -A /root /home");
    assert_eq!(out, "/home:\n\n/root:\n", "/root and /home are empty inside");
    let (code, out, err) = d.sh(&id, &format!("ls -l {} {}/notes.txt", root_probe.display(), user_dir.display()));
    assert_eq!(code, 2, "ls: host probes visible inside: {out}");
    assert_eq!(err.matches("No such file or directory").count(), 2, "{err}");
    // Neither is the daemon's home, its token, nor the rest of /var/tmp.
    assert_eq!(sh_ok(&d, &id, "ls -A /var/tmp"), "", "/var/tmp is the image's empty one");
    let (code, out, err) = d.sh(&id, &format!("cat {}", token_path.display()));
    assert_eq!(code, 1, "cat: token readable inside: {out}");
    assert!(err.contains("No such file or directory"), "{err}");

    // The token's value is nowhere reachable. Control: grep finds a marker
    // placed in the same places, and one passed in the environment.
    let mark = format!("cairn-iso-mark-{tag}");
    let dirs = "/etc /workspace /tmp /var /root /home /run /opt /srv /mnt";
    let (code, out, err) = d.sh(
        &id,
        &format!("echo {mark} > /workspace/m; echo {mark} > /tmp/m; grep -rlsF -- {mark} {dirs}; echo rc=$?"),
    );
    assert_eq!((code, out.as_str()), (0, "/workspace/m\n/tmp/m\nrc=0\n"), "the control marker is found: {err}");
    let (_, out, err) = d.sh(&id, &format!("grep -rlsF -- {token} {dirs}; echo rc=$?"));
    assert!(out.ends_with("rc=1\n") || out.ends_with("rc=2\n"), "grep ran: {out} {err}");
    assert!(!out.contains('/'), "the token appears inside in: {out}");
    // The pattern goes through a file, so no command line holds it whole.
    let proc_probe = |word: &str| {
        let (a, b) = word.split_at(word.len() / 2);
        format!("printf %s%s {a} {b} > /dev/shm/pat; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -cFf /dev/shm/pat; rm /dev/shm/pat; true")
    };
    let out = d.ok(&["exec", &id, "--env", &format!("ISO_MARK={mark}"), "--", "sh", "-c", &proc_probe(&mark)]);
    let found: u32 = out.trim().parse().expect("a count");
    assert!(found >= 1, "the control marker is in the environment of the command and its children");
    let out = sh_ok(&d, &id, &proc_probe(&token));
    assert_eq!(out.trim(), "0", "the token is in a sandbox process's environment or command line");

    // Secret files of /etc stay out; the rest of /etc is there.
    let out = sh_ok(&d, &id, "for f in /etc/passwd /etc/group /etc/shadow /etc/gshadow /etc/machine-id; do [ -e $f ] && echo \"$f present\" || echo \"$f absent\"; done");
    assert_eq!(
        out,
        "/etc/passwd present\n/etc/group present\n/etc/shadow absent\n/etc/gshadow absent\n/etc/machine-id absent\n"
    );
    destroy_clean(&d, &id);
}

#[test]
fn writes_to_the_base_image_land_in_the_task_layer() {
    let d = Daemon::start();
    let tag = rand_hex();
    let usr_probe = format!("/usr/bin/cairn-probe-{tag}");
    let etc_probe = format!("/etc/cairn-probe-{tag}");
    let _guard = RemoveOnDrop(vec![PathBuf::from(&usr_probe)]);
    let image = d.home().join("images/host/rootfs");
    let before = snapshot(&image);
    assert!(!before.is_empty(), "image at {}", image.display());
    let a = d.create(&[]);
    let b = d.create(&[]);

    sh_ok(&d, &a, &format!("touch {usr_probe} && echo layered > {etc_probe}"));
    // Control: the writer sees its own files.
    assert_eq!(sh_ok(&d, &a, &format!("ls {usr_probe}; cat {etc_probe}")), format!("{usr_probe}\nlayered\n"));

    // Not on the host, not in the image, not in the neighbour.
    assert!(!Path::new(&usr_probe).exists(), "{usr_probe} reached the host's /usr");
    assert!(!Path::new(&etc_probe).exists(), "{etc_probe} reached the host's /etc");
    assert_eq!(snapshot(&image), before, "the image directory changed");
    let (code, out, err) = d.sh(&b, &format!("ls {usr_probe} {etc_probe}"));
    assert_eq!(code, 2, "ls: the other task sees them: {out}");
    assert_eq!(err.matches("No such file or directory").count(), 2, "{err}");
    assert!(sh_ok(&d, &b, "ls /usr/bin").contains("\nsh\n"), "the neighbour sees the base image itself");

    // They are in the writer's upper directories on its disk.
    let disk = d.home().join("run").join(&a).join("disk");
    let usr_upper = disk.join("at_usr/upper/bin").join(format!("cairn-probe-{tag}"));
    let etc_upper = disk.join("root/upper/etc").join(format!("cairn-probe-{tag}"));
    assert!(usr_upper.is_file(), "{} missing", usr_upper.display());
    assert_eq!(std::fs::read_to_string(&etc_upper).expect("etc probe in the upper"), "layered\n");
    assert!(!d.home().join("run").join(&b).join("disk/at_usr/upper/bin").join(format!("cairn-probe-{tag}")).exists());

    destroy_clean(&d, &a);
    destroy_clean(&d, &b);
    assert!(!Path::new(&usr_probe).exists());
    assert_eq!(snapshot(&image), before, "the image directory changed");
}

#[test]
fn another_task_s_files_and_processes_are_invisible() {
    let d = Daemon::start();
    let a = d.create(&[]);
    let b = d.create(&[]);
    let marker = format!("marker-{}", rand_hex());

    let t = Instant::now();
    sh_ok(&d, &a, &format!("echo a > /workspace/{marker}; sleep 300 </dev/null >/dev/null 2>&1 &"));
    assert!(t.elapsed() < Duration::from_secs(10), "exec returns with a background child running");

    // Control: A sees its own sleep and marker.
    let ps_a = sh_ok(&d, &a, "ps -eo pid=,comm=");
    assert!(ps_a.lines().any(|l| l.trim().ends_with(" sleep")), "A's ps: {ps_a}");
    assert!(sh_ok(&d, &a, "ls /workspace").lines().any(|l| l == marker));
    // The host sees it too, in A's cgroup (under gvisor, A's processes
    // are the sentry's: its pid stands for them).
    let procs = std::fs::read_to_string(cgroup_file(&a, "pids", "cgroup.procs")).expect("A's cgroup");
    let host_sleep: i32 = if under_gvisor() {
        init_pid(&d, &a)
    } else {
        procs
            .lines()
            .filter_map(|p| p.trim().parse::<i32>().ok())
            .find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).map(|c| c.trim() == "sleep").unwrap_or(false))
            .unwrap_or_else(|| panic!("no sleep among A's processes {procs:?}"))
    };

    // B sees only itself: its init as pid 1, its shell, its ps.
    let ps_b = sh_ok(&d, &b, "ps -eo pid=,comm=");
    let rows: Vec<(i32, String)> = ps_b
        .lines()
        .filter_map(|l| {
            let (pid, comm) = l.trim().split_once(' ')?;
            Some((pid.parse().ok()?, comm.trim().to_owned()))
        })
        .collect();
    // Under gvisor the init is `cairn` run by the host's loader.
    let init = if under_gvisor() { "ld.so" } else { "cairn" };
    assert_eq!(rows.first(), Some(&(1, init.to_owned())), "B's pid 1 is its init: {ps_b}");
    assert!(rows.iter().all(|(_, c)| c != "sleep"), "B sees A's sleep: {ps_b}");
    assert_eq!(rows.iter().map(|(_, c)| c.as_str()).collect::<Vec<_>>(), [init, "sh", "ps"], "{ps_b}");
    let pids_b = sh_ok(&d, &b, "ls /proc | grep -E '^[0-9]+$' | wc -l");
    let pids_b: usize = pids_b.trim().parse().expect("a count");
    assert!((2..=5).contains(&pids_b), "B's /proc has {pids_b} processes");
    assert!(host_sleep > 100, "host pid {host_sleep} too small to tell namespaces apart");
    let (code, _, err) = d.sh(&b, &format!("kill -0 {host_sleep}"));
    assert_eq!(code, 1, "B can signal A's sleep by its host pid");
    assert!(err.contains("No such process"), "{err}");
    let ls_b = sh_ok(&d, &b, "ls -A /workspace");
    assert!(!ls_b.contains(&marker), "B sees A's marker: {ls_b}");
    let (code, _, _) = d.sh(&b, &format!("test -e /workspace/{marker}"));
    assert_eq!(code, 1, "B sees A's marker");

    // A's sleep is still alive after all that.
    assert!(sh_ok(&d, &a, "ps -eo comm=").lines().any(|l| l == "sleep"));
    destroy_clean(&d, &a);
    destroy_clean(&d, &b);
}

#[test]
fn network_is_loopback_only() {
    let ip = ["/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip", "/bin/ip"].into_iter().find(|p| Path::new(p).exists());
    let ip = ip.unwrap_or_else(|| panic!("`ip` is missing on the host: install iproute2 (apt-get install -y iproute2)"));
    let d = Daemon::start();
    let id = d.create(&[]);

    let host = common::run(Command::new(ip).args(["-o", "link"])).expect("host ip link");
    let host_links = link_names(&String::from_utf8_lossy(&host.stdout));
    assert!(host_links.len() > 1 && host_links.contains(&"lo".to_owned()), "host links: {host_links:?}");
    let inside = link_names(&sh_ok(&d, &id, "ip -o link"));
    assert_eq!(inside, ["lo"], "links inside");

    // The daemon's port: reachable from the host, refused inside.
    let port = daemon_port(&d);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("the host reaches the daemon");
    let (code, out, err) = d.sh(&id, &format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' && echo connected"));
    assert_eq!(code, 1, "connected to the daemon from inside: {out}");
    assert!(err.contains("Connection refused"), "{err}");
    // Control: TCP over the sandbox's own loopback works, on that very port.
    let py = format!(
        "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen(1)\n\
         c = socket.create_connection(('127.0.0.1', {port}), timeout=2)\na, _ = s.accept()\nc.sendall(b'hi')\nprint(a.recv(2).decode())\n"
    );
    let out = d.ok(&["exec", &id, "--", "/usr/bin/python3", "-c", &py]);
    assert_eq!(out, "hi\n", "loopback inside");

    // No route out: fails at once, nothing is sent.
    let t = Instant::now();
    let (code, out, err) = d.sh(&id, "bash -c 'exec 3<>/dev/tcp/10.255.255.1/80' && echo connected");
    assert_eq!(code, 1, "{out}");
    // gVisor's own network stack words it differently.
    let no_route = if under_gvisor() { "No route to host" } else { "Network is unreachable" };
    assert!(err.contains(no_route), "{err}");
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    destroy_clean(&d, &id);
}

#[test]
fn root_inside_is_an_unprivileged_host_uid() {
    if under_gvisor() {
        return root_inside_is_the_second_kernel_s();
    }
    let d = Daemon::start();
    let id = d.create(&[]);
    let host_map = std::fs::read_to_string("/proc/self/uid_map").expect("host uid_map");
    assert_eq!(host_map.split_whitespace().collect::<Vec<_>>(), ["0", "0", "4294967295"], "the host is the initial namespace");

    let out = sh_ok(&d, &id, "cat /proc/self/uid_map /proc/self/gid_map; id -u; id -g");
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), 4, "{out}");
    let base: u32 = lines[0][1].parse().expect("uid base");
    assert_eq!(lines[0], ["0", &base.to_string(), "65536"], "uid_map {out}");
    assert_eq!(lines[1], lines[0], "gid_map {out}");
    assert!(base > 0, "uid 0 maps to host uid 0");
    assert_eq!((lines[2][0], lines[3][0]), ("0", "0"), "root inside");
    assert_eq!(d.task(&id)["sandbox_uid_base"].as_u64(), Some(u64::from(base)));

    assert_eq!(sh_ok(&d, &id, "echo x > /workspace/owned && stat -c %u:%g /workspace/owned"), "0:0\n");
    let host = d.home().join("run").join(&id).join("disk/root/upper/workspace/owned");
    let m = std::fs::metadata(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    assert_eq!((m.uid(), m.gid()), (base, base), "owner on the host of {}", host.display());
    destroy_clean(&d, &id);
}

/// Under gvisor, root inside is the sandbox kernel's: ids are not mapped
/// on the host (files in the writable layer carry the sandbox's own), and
/// what stands between it and the host is that kernel, whose sentry runs
/// under its own syscall filter, without privileges to gain.
fn root_inside_is_the_second_kernel_s() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let (_, host_kernel, _) = host_sh("uname -r");
    let inside = sh_ok(&d, &id, "uname -r; id -u; id -g");
    let lines: Vec<&str> = inside.lines().collect();
    assert_eq!(lines[1..], ["0", "0"], "root inside: {inside}");
    assert_ne!(lines[0], host_kernel.trim(), "the sandbox runs on its own kernel: {inside}");
    assert_eq!(d.task(&id)["sandbox_uid_base"].as_u64(), Some(0), "no host id range is given out");
    assert_eq!(sh_ok(&d, &id, "echo x > /workspace/owned && stat -c %u:%g /workspace/owned"), "0:0\n");
    let host = d.home().join("run").join(&id).join("disk/root/upper/workspace/owned");
    let m = std::fs::metadata(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    assert_eq!((m.uid(), m.gid()), (0, 0), "owner on the host of {}", host.display());
    // The sentry: filtered and without privileges to gain.
    let status = std::fs::read_to_string(format!("/proc/{}/status", init_pid(&d, &id))).expect("the sentry's status");
    assert!(status.contains("NoNewPrivs:\t1") && status.contains("Seccomp:\t2"), "{status}");
    destroy_clean(&d, &id);
}

/// The filter is on everywhere. `no_new_privs` only under gvisor: a
/// native sandbox lets the image's set-id programs work inside (up to its
/// own unprivileged root and bounded capabilities; host_privilege.rs).
#[test]
fn seccomp_is_on_and_no_new_privs_only_under_gvisor() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let probe = "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status";
    let (code, host, _) = host_sh(probe);
    assert_eq!(code, 0);
    assert_eq!(host, "NoNewPrivs:\t0\nSeccomp:\t0\n", "a plain host process");
    if under_gvisor() {
        // gVisor's status file has no NoNewPrivs line: ask prctl.
        let nnp = "python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'; grep '^Seccomp:' /proc/self/status";
        assert_eq!(sh_ok(&d, &id, nnp), "1\nSeccomp:\t2\n", "inside");
    } else {
        assert_eq!(sh_ok(&d, &id, probe), "NoNewPrivs:\t0\nSeccomp:\t2\n", "inside");
    }
    destroy_clean(&d, &id);
}

/// Each syscall's errno (0 for success). unshare and ptrace run in a
/// forked child; a mount that succeeds is undone at once.
const SYSCALL_PROBE: &str = r#"
import ctypes, os, tempfile
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *args)
    return r, (ctypes.get_errno() if r == -1 else 0)
def in_child(nr, *args):
    pid = os.fork()
    if pid == 0:
        _, e = call(nr, *args)
        os._exit(e)
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st)
d = tempfile.mkdtemp()
r, e = call(165, b"none", d.encode(), b"tmpfs", L(0), None)
if r == 0:
    call(166, d.encode(), L(0))
os.rmdir(d)
print("mount", e)
print("unshare", in_child(272, L(0x10000000)))
print("ptrace", in_child(101, L(0), L(0), L(0), L(0)))
print("keyctl", call(250, L(0), L(-3), L(0))[1])
print("bpf", call(321, L(0), None, L(0))[1])
"#;

fn parse_probe(out: &str) -> BTreeMap<String, i32> {
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.trim().parse().unwrap_or_else(|_| panic!("bad probe line {k} {v:?}"))))
        .collect()
}

#[test]
fn privileged_syscalls_fail_with_eperm() {
    #[cfg(not(target_arch = "x86_64"))]
    panic!("the syscall numbers of this probe are x86_64's");
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "/usr/bin/python3 is missing on the host: install python3 (apt-get install -y python3)");
    let names = ["bpf", "keyctl", "mount", "ptrace", "unshare"];

    // Control: on the host, as root, none of them is refused.
    let host = common::run(Command::new(python).args(["-c", SYSCALL_PROBE])).expect("run the probe on the host");
    assert!(host.status.success(), "host probe: {}", String::from_utf8_lossy(&host.stderr));
    let host = parse_probe(&String::from_utf8_lossy(&host.stdout));
    assert_eq!(host.keys().map(String::as_str).collect::<Vec<_>>(), names);
    for (name, errno) in &host {
        assert_ne!(*errno, libc::EPERM, "{name} is refused on the host too: {host:?}");
    }
    assert_eq!((host["mount"], host["unshare"], host["ptrace"], host["keyctl"]), (0, 0, 0, 0), "{host:?}");

    let d = Daemon::start();
    let id = d.create(&[]);
    let inside = parse_probe(&d.ok(&["exec", &id, "--", "/usr/bin/python3", "-c", SYSCALL_PROBE]));
    assert_eq!(inside.keys().map(String::as_str).collect::<Vec<_>>(), names);
    for (name, errno) in &inside {
        assert_eq!(*errno, libc::EPERM, "{name} inside: {inside:?}");
    }

    // The same through the usual tools; on the host they work.
    let (code, _, err) = host_sh("unshare -U true");
    assert_eq!(code, 0, "unshare -U on the host: {err}");
    let dir = tempfile::tempdir().expect("temp dir");
    let (code, _, err) = host_sh(&format!("mount -t tmpfs none {0} && umount {0}", dir.path().display()));
    assert_eq!(code, 0, "mount on the host: {err}");
    let (code, _, err) = d.sh(&id, "unshare -U true");
    assert_eq!(code, 1, "unshare -U inside: {err}");
    assert!(err.contains("Operation not permitted"), "{err}");
    let (code, _, err) = d.sh(&id, "mount -t tmpfs none /mnt");
    assert_eq!(code, 32, "mount(8) reports a mount failure: {err}");
    assert!(err.contains("permission denied") || err.contains("Operation not permitted"), "{err}");
    assert_eq!(sh_ok(&d, &id, "grep -c ' /mnt ' /proc/mounts || true"), "0\n", "nothing got mounted");
    destroy_clean(&d, &id);
}

/// Forks `n` background sleeps in a subshell (dash gives up at the first
/// failed fork), counts the processes other than init and this shell
/// without forking, then kills them all.
fn fork_script(n: u32) -> String {
    format!(
        "(i=0; while [ $i -lt {n} ]; do sleep 30 </dev/null >/dev/null 2>&1 & i=$((i+1)); echo $i > /tmp/n; done) 2>/dev/null\n\
         read n < /tmp/n\n\
         c=0; for p in /proc/[0-9]*; do [ ${{p#/proc/}} = 1 ] || [ ${{p#/proc/}} = $$ ] || c=$((c+1)); done\n\
         echo \"started=$n running=$c\"\n\
         kill -9 -1\n"
    )
}

/// Counts the sleeps still there once the killed ones are reaped: `kill -9 -1`
/// returns before init has collected them, and a zombie still matches pgrep.
const SLEEPS_LEFT: &str = "echo ok; for i in $(seq 100); do pgrep -x sleep >/dev/null || break; sleep 0.05; done; pgrep -c -x sleep || true";

fn started_running(out: &str) -> (u32, u32) {
    let nums: Vec<u32> = out
        .trim()
        .split(' ')
        .filter_map(|kv| kv.split_once('=').and_then(|(_, v)| v.parse().ok()))
        .collect();
    assert_eq!(nums.len(), 2, "{out:?}");
    (nums[0], nums[1])
}

#[test]
fn a_fork_bomb_stops_at_the_pids_limit() {
    if under_gvisor() {
        return a_fork_bomb_ends_the_gvisor_sandbox_not_the_host();
    }
    let d = Daemon::start();
    let small = d.create(&["--pids", "32"]);
    let big = d.create(&[]);
    let cg = task_cgroup(&small).controller_dir("pids").expect("a pids controller").to_owned();
    assert_eq!(std::fs::read_to_string(cg.join("pids.max")).expect("pids.max").trim(), "32");

    let (code, out, err) = d.sh(&small, &fork_script(200));
    assert_eq!(code, 0, "{out} {err}");
    let (started, running) = started_running(&out);
    // init, the shell and the subshell count too.
    assert!((20..=29).contains(&started), "started {started} of 200 under --pids 32");
    assert_eq!(running, started);
    if let Ok(ev) = std::fs::read_to_string(cg.join("pids.events")) {
        let hits: u64 = ev.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(hits > 0, "the pids controller refused forks: {ev}");
    }
    // Still usable, and the bomb is gone.
    assert_eq!(sh_ok(&d, &small, SLEEPS_LEFT), "ok\n0\n");

    // Control: the default limit (256) starts 100 without trouble.
    assert_eq!(d.task(&big)["limits"]["pids"], 256);
    let out = sh_ok(&d, &big, &fork_script(100));
    assert_eq!(started_running(&out), (100, 100), "{out}");
    assert_eq!(sh_ok(&d, &big, SLEEPS_LEFT), "ok\n0\n");
    destroy_clean(&d, &small);
    destroy_clean(&d, &big);
}

/// Under gvisor nothing inside counts root's processes: the host's pids
/// limit on the sentry's tasks (about 24 per process inside) stops the
/// bomb, and the sandbox with it; the task's next command recovers it.
fn a_fork_bomb_ends_the_gvisor_sandbox_not_the_host() {
    let d = Daemon::start();
    let small = d.create(&["--pids", "32"]);
    let big = d.create(&[]);
    let cg = task_cgroup(&small).controller_dir("pids").expect("a pids controller").to_owned();
    let max: u64 = std::fs::read_to_string(cg.join("pids.max")).expect("pids.max").trim().parse().expect("a number");
    assert_eq!(max, 32 * 24 + 256, "the host's limit for 32 processes inside");

    let (_, out, err) = d.sh(&small, &fork_script(400));
    assert!(!out.contains("started=400"), "the bomb was not stopped: {out} {err}");
    if let Ok(ev) = std::fs::read_to_string(cg.join("pids.events")) {
        let hits: u64 = ev.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(hits > 0, "the pids controller refused forks: {ev}");
    }
    // The task goes on (its sandbox recovered if the bomb ended it).
    assert_eq!(sh_ok(&d, &small, "echo ok"), "ok\n");

    // Control: the default limit starts 60 processes without trouble.
    assert_eq!(d.task(&big)["limits"]["pids"], 256);
    let out = sh_ok(&d, &big, &fork_script(60));
    assert_eq!(started_running(&out), (60, 60), "{out}");
    assert_eq!(sh_ok(&d, &big, SLEEPS_LEFT), "ok\n0\n");
    destroy_clean(&d, &small);
    destroy_clean(&d, &big);
}

/// The CPU limit as the task's cgroup shows it: (quota, period) in
/// microseconds, from `cpu.max` on v2 or the CFS files on v1.
fn cpu_quota(id: &str) -> (String, String) {
    let read = |file: &str| {
        let path = cgroup_file(id, "cpu", file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_owned()
    };
    match CgroupLayout::detect().expect("cgroup layout").version() {
        CgroupVersion::V2 => {
            let max = read("cpu.max");
            let (quota, period) = max.split_once(' ').unwrap_or_else(|| panic!("cpu.max {max:?}"));
            (quota.to_owned(), period.to_owned())
        }
        CgroupVersion::V1 => (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us")),
    }
}

#[test]
fn cpus_sets_the_quota_of_the_task_s_cgroup() {
    let d = Daemon::start();
    let half = d.create(&["--cpus", "0.5"]);
    let two = d.create(&["--cpus", "2"]);
    let default = d.create(&[]);
    assert_eq!(d.task(&half)["limits"]["cpus"], "0.5");
    assert_eq!(cpu_quota(&half), ("50000".to_owned(), "100000".to_owned()), "--cpus 0.5");
    // Controls: another value, and the default of one CPU.
    assert_eq!(cpu_quota(&two), ("200000".to_owned(), "100000".to_owned()), "--cpus 2");
    assert_eq!(d.task(&default)["limits"]["cpus"], "1", "{}", d.task(&default));
    assert_eq!(cpu_quota(&default), ("100000".to_owned(), "100000".to_owned()), "the default");
    // The limit holds the task's processes: its init and what it runs.
    let procs = cgroup_file(&half, "cpu", "cgroup.procs");
    let listed = || std::fs::read_to_string(&procs).unwrap_or_else(|e| panic!("{}: {e}", procs.display()));
    let init = init_pid(&d, &half).to_string();
    assert!(listed().lines().any(|p| p == init), "init {init} not in {}: {}", procs.display(), listed());
    let out = sh_ok(&d, &half, "sleep 300 </dev/null >/dev/null 2>&1 & echo $!");
    assert!(!out.trim().is_empty(), "{out}");
    if under_gvisor() {
        // Inside processes are the sentry's: it and all its host tasks
        // (the gofer, the ptrace stubs) are in the group, none in the other.
        let ours: Vec<String> = listed().lines().map(str::to_owned).collect();
        assert!(ours.len() >= 3, "the sentry, the gofer and a stub at least: {ours:?}");
        let other = std::fs::read_to_string(cgroup_file(&two, "cpu", "cgroup.procs")).expect("the other task's group");
        assert!(!other.lines().any(|p| ours.contains(&p.to_owned())), "{other}");
        for id in [&half, &two, &default] {
            destroy_clean(&d, id);
        }
        return;
    }
    let sleeping: Vec<String> = listed()
        .lines()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep"))
        .map(str::to_owned)
        .collect();
    assert_eq!(sleeping.len(), 1, "the task's sleep is in its cpu group: {}", listed());
    // ... and not in the other task's.
    let other = std::fs::read_to_string(cgroup_file(&two, "cpu", "cgroup.procs")).expect("the other task's group");
    assert!(!other.lines().any(|p| sleeping.contains(&p.to_owned())), "{other}");
    for id in [&half, &two, &default] {
        destroy_clean(&d, id);
    }
}

#[test]
fn exceeding_memory_is_oom_killed_and_reported() {
    let d = Daemon::start();
    let id = d.create(&["--memory", "64M", "--pids", "1024"]);

    // Control first: well under the limit works and is not an OOM.
    let (exit, _, err) = exec_json(&d, &id, "dd if=/dev/zero of=/dev/null bs=16M count=1");
    assert_eq!((exit["exit_code"].as_i64(), exit["oom_killed"].as_bool()), (Some(0), Some(false)), "{exit} {err}");
    assert!(err.contains("1+0 records out"), "{err}");

    let (exit, _, err) = exec_json(&d, &id, "dd if=/dev/zero of=/dev/null bs=128M count=1");
    assert_eq!(exit["oom_killed"], true, "{exit} {err}");
    if under_gvisor() {
        // The host's OOM killer ends the sentry, so the whole sandbox; the
        // task's next command recovers it.
        assert_eq!(exit["memory_limit"], "64M", "{exit}");
        assert!(!err.contains("records out"), "dd finished: {err}");
        assert_eq!(sh_ok(&d, &id, "echo ok"), "ok\n");
        destroy_clean(&d, &id);
        return;
    }
    assert_eq!(exit["exit_code"], 137, "{exit}");
    assert_eq!(exit["memory_limit"], "64M", "{exit}");
    assert!(err.contains("out of memory"), "{err}");
    assert!(!err.contains("records out"), "dd finished: {err}");

    let log = d.json(&["log", &id]);
    let execs: Vec<&Value> = log.as_array().expect("events").iter().filter(|e| e["kind"] == "exec").collect();
    let entry = |bs: &str| {
        *execs
            .iter()
            .find(|e| e["args"]["argv"][2].as_str().is_some_and(|a| a.contains(bs)))
            .unwrap_or_else(|| panic!("no exec with {bs} in {log}"))
    };
    let (oom, ok) = (entry("bs=128M"), entry("bs=16M"));
    assert_eq!((oom["args"]["oom_killed"].as_bool(), oom["exit_code"].as_i64()), (Some(true), Some(137)), "{oom}");
    assert_eq!((ok["args"]["oom_killed"].as_bool(), ok["exit_code"].as_i64()), (Some(false), Some(0)), "{ok}");
    // The task survives its command's OOM.
    assert_eq!(sh_ok(&d, &id, "echo ok"), "ok\n");

    // The sandbox's init is never the OOM killer's choice, its commands
    // are: the init at -1000 and they at 0 where the host lets the daemon
    // lower a score (CAP_SYS_RESOURCE), else the init at the daemon's 0
    // and they at 1000. They cannot go below 0, nor touch the init's.
    let init = init_pid(&d, &id);
    let score_adj = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).expect("the init's oom_score_adj").trim().to_owned();
    let (init_adj, command_adj) = if host_may_lower_oom_scores() { ("-1000", "0\n") } else { ("0", "1000\n") };
    assert_eq!(score_adj(init), init_adj);
    assert_eq!(sh_ok(&d, &id, "cat /proc/self/oom_score_adj"), command_adj);
    for refused in ["echo -1 > /proc/self/oom_score_adj", "echo -17 > /proc/self/oom_adj", "echo 999 > /proc/1/oom_score_adj"] {
        let (code, out, err) = d.sh(&id, refused);
        assert_ne!(code, 0, "{refused:?} worked: {out} {err}");
    }
    assert_eq!(sh_ok(&d, &id, "echo 1000 > /proc/self/oom_score_adj && cat /proc/self/oom_score_adj"), "1000\n");
    // Many processes, each smaller than the init, together far over the
    // limit: the OOM killer takes them, never the init, so the sandbox
    // and the next command stay.
    let workload = "for i in $(seq 60); do sh -c 'x=$(head -c 3000000 /dev/zero | tr \"\\0\" a); sleep 3' & done; wait";
    let (exit, _, err) = exec_json(&d, &id, workload);
    assert_eq!(exit["oom_killed"], true, "{exit} {err}");
    assert_eq!(init_pid(&d, &id), init, "the sandbox was replaced");
    assert_eq!(score_adj(init), init_adj, "the init lives on");
    let t = d.task(&id);
    assert_eq!((t["state"].as_str(), t["sandbox"].as_str()), (Some("running"), Some("ready")), "{t}");
    assert_eq!(sh_ok(&d, &id, "echo ok"), "ok\n");
    let log = d.json(&["log", &id]);
    assert!(!log.as_array().expect("events").iter().any(|e| e["kind"] == "sandbox_lost"), "{log}");
    destroy_clean(&d, &id);
}

#[test]
fn a_full_disk_stops_at_its_quota() {
    let d = Daemon::start();
    let full = d.create(&["--disk", "128M"]);
    let neighbour = d.create(&[]);
    let image = d.home().join("disks").join(format!("{full}.img"));
    assert_eq!(std::fs::metadata(&image).expect("disk image").len(), 128 * MIB);

    let free_before = free_bytes(d.home());
    let (code, out, err) = d.sh(&full, "dd if=/dev/zero of=/workspace/fill bs=1M count=300 2>&1; rc=$?; sync; exit $rc");
    let free_after = free_bytes(d.home());
    assert_eq!(code, 1, "dd fails: {out} {err}");
    assert!(out.contains("No space left on device"), "{out}");
    let written = sh_ok(&d, &full, "stat -c %s /workspace/fill");
    let written: u64 = written.trim().parse().expect("a size");
    assert!(written > 64 * MIB && written < 128 * MIB, "wrote {written} bytes into a 128M disk");
    // The host paid at most the image's size.
    let allocated = std::fs::metadata(&image).expect("disk image").blocks() * 512;
    assert!(allocated <= 128 * MIB, "the image holds {allocated} bytes");
    let used = free_before.saturating_sub(free_after);
    assert!(used < 128 * MIB + 48 * MIB, "host free space fell by {} MiB", used / MIB);

    // The neighbour is unaffected, and so is the full task's /tmp.
    let (code, out, err) = d.sh(&neighbour, "dd if=/dev/zero of=/workspace/fill bs=1M count=50 2>&1 && stat -c %s /workspace/fill");
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.ends_with(&format!("{}\n", 50 * MIB)), "{out}");
    // Freeing space makes the full task writable again.
    assert_eq!(sh_ok(&d, &full, "rm /workspace/fill && echo ok > /workspace/after && cat /workspace/after"), "ok\n");
    destroy_clean(&d, &full);
    destroy_clean(&d, &neighbour);
}

#[test]
fn a_second_daemon_leaves_this_one_s_sandboxes_alone() {
    let a = Daemon::start();
    let id = a.create(&[]);
    sh_ok(&a, &id, "sleep 300 </dev/null >/dev/null 2>&1 &");
    let pid = init_pid(&a, &id);

    // Another home with a leftover of its own: a run directory and a
    // cgroup of a task its store does not know.
    let mut b = Daemon::start();
    b.kill();
    let alphabet = b"23456789abcdefghijkmnpqrstuvwxyz";
    let fake: String = std::iter::once('t')
        .chain(rand_hex().bytes().chain(rand_hex().bytes()).take(11).map(|x| alphabet[usize::from(x) % alphabet.len()] as char))
        .collect();
    // The fake task's group in every hierarchy the product uses here, made
    // directly under the existing `cairn` parents: nothing else is created.
    let fake_groups = task_cgroup(&fake).paths();
    struct RmdirOnDrop(Vec<PathBuf>);
    impl Drop for RmdirOnDrop {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_dir(p);
            }
        }
    }
    let _groups = RmdirOnDrop(fake_groups.clone());
    for g in &fake_groups {
        assert!(g.parent().is_some_and(Path::is_dir), "{}: the first daemon's task made its parent", g.display());
        std::fs::create_dir(g).unwrap_or_else(|e| panic!("{}: {e}", g.display()));
    }
    let fake_run = b.home().join("run").join(&fake);
    std::fs::create_dir_all(&fake_run).expect("fake run dir");
    b.spawn(&[]);

    // Control: the new daemon cleaned up what was its own...
    let deadline = Instant::now() + Duration::from_secs(5);
    while (fake_run.exists() || fake_groups.iter().any(|g| g.exists())) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!fake_run.exists(), "{} was not cleaned up", fake_run.display());
    for g in &fake_groups {
        assert!(!g.exists(), "{} was not cleaned up", g.display());
    }
    // ...and left the first daemon's sandbox running.
    for g in task_cgroup(&id).paths() {
        assert!(g.is_dir(), "the other daemon removed {id}'s cgroup {}", g.display());
    }
    assert_eq!(init_pid(&a, &id), pid);
    assert_eq!(a.task(&id)["sandbox"], "ready", "{}", a.task(&id));
    assert_eq!(sh_ok(&a, &id, "pgrep -c sleep"), "1\n", "the background sleep survived");
    drop(b);
    destroy_clean(&a, &id);
}

/// Uid ranges are a host resource: sandboxes of two daemons on two homes
/// never share one, while each daemon alone still starts from the lowest.
#[test]
fn two_daemons_never_share_a_uid_range() {
    let a = Daemon::start();
    let b = Daemon::start();
    let ta = a.create(&[]);
    let tb = b.create(&[]);
    let base_a = a.task(&ta)["sandbox_uid_base"].as_u64().expect("uid base of a");
    let base_b = b.task(&tb)["sandbox_uid_base"].as_u64().expect("uid base of b");
    if under_gvisor() {
        // No host uid range is given out: the sandbox's kernel maps ids.
        assert_eq!((base_a, base_b), (0, 0));
        return;
    }
    assert_ne!(base_a, base_b, "both daemons gave out the same host uid range");
    let (_, map_b, _) = b.sh(&tb, "cat /proc/self/uid_map");
    assert!(map_b.contains(&base_b.to_string()), "the map inside is the recorded range: {map_b}");
    // Positive control: within one daemon, a second task gets its own range too.
    let ta2 = a.create(&[]);
    let base_a2 = a.task(&ta2)["sandbox_uid_base"].as_u64().unwrap();
    assert!(base_a2 != base_a && base_a2 != base_b);
}

#[test]
fn every_namespace_is_the_sandbox_s_own_and_capabilities_are_bounded() {
    let d = Daemon::start();
    let (a, b) = (d.create(&[]), d.create(&[]));
    if under_gvisor() {
        // Each sandbox is a kernel of its own: its sentry on the host is
        // in namespaces of its own (not a pid namespace: the ptrace
        // platform traces its stubs from the host's).
        let kinds = ["ipc", "mnt", "net", "uts"];
        let ns = |pid: i32, k: &str| std::fs::read_link(format!("/proc/{pid}/ns/{k}")).unwrap_or_else(|e| panic!("{k} of {pid}: {e}"));
        let (sa, sb, me) = (init_pid(&d, &a), init_pid(&d, &b), std::process::id() as i32);
        for k in kinds {
            assert_eq!(ns(sa, k), ns(sa, k), "positive control");
            assert_ne!(ns(sa, k), ns(me, k), "the sentry has its own {k} namespace");
            assert_ne!(ns(sa, k), ns(sb, k), "two sandboxes do not share a {k} namespace");
        }
    }
    let kinds: &[&str] = if under_gvisor() { &[] } else { &["cgroup", "ipc", "mnt", "net", "pid", "user", "uts"] };
    let probe: String = kinds.iter().map(|k| format!("readlink /proc/self/ns/{k}; ")).collect();
    let (code, host, _) = host_sh(&probe);
    assert_eq!(code, 0);
    let (in_a, again_a, in_b) = (sh_ok(&d, &a, &probe), sh_ok(&d, &a, &probe), sh_ok(&d, &b, &probe));
    // Positive control: the probe gives the same answer twice in one sandbox.
    assert_eq!(in_a, again_a, "one sandbox, one set of namespaces");
    for (i, kind) in kinds.iter().enumerate() {
        let (h, x, y) = (host.lines().nth(i), in_a.lines().nth(i), in_b.lines().nth(i));
        assert!(x.is_some_and(|x| x.starts_with(&format!("{kind}:["))), "{kind}: {in_a}");
        assert_ne!(x, h, "the sandbox has its own {kind} namespace");
        assert_ne!(x, y, "two sandboxes do not share a {kind} namespace");
    }

    // Root inside holds exactly the bounded set, and nothing to inherit.
    let mut want: u64 = cairn_sandbox::inspect::SANDBOX_CAPS.iter().fold(0, |m, c| m | 1 << c.index());
    if under_gvisor() {
        // runsc takes CAP_NET_RAW away unless told otherwise (--net-raw):
        // a sandbox without a network device has no use for it.
        want &= !(1 << 13);
    }
    let status = sh_ok(&d, &a, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status");
    let cap = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {status}"));
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    assert_eq!((cap("CapBnd:"), cap("CapEff:"), cap("CapPrm:")), (want, want, want), "{status}");
    // gVisor has no ambient set (and no CapAmb line).
    let amb = if under_gvisor() { 0 } else { cap("CapAmb:") };
    assert_eq!((cap("CapInh:"), amb), (0, 0), "{status}");
    // Positive control: the host's root has more than the sandbox's.
    let (_, host_status, _) = host_sh("grep '^CapEff:' /proc/self/status");
    let host_eff = u64::from_str_radix(host_status.split_whitespace().nth(1).unwrap(), 16).unwrap();
    assert!(host_eff & !want != 0, "the host's root has capabilities the sandbox lacks: {host_eff:x}");
    destroy_clean(&d, &a);
    destroy_clean(&d, &b);
}

/// What a sandbox can read of its host's layout and clocks: its mount
/// table names no path of the host (the overlay's options are relative to
/// the run directory), and it has a time namespace of its own whose
/// clocks started near zero, so its uptime is its own.
#[test]
fn the_mount_table_names_no_host_path_and_the_clocks_are_the_sandboxs_own() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let home = std::fs::canonicalize(d.home()).unwrap().display().to_string();
    let inside = sh_ok(&d, &id, "cat /proc/self/mountinfo");
    assert!(inside.contains(" / "), "a mount table: {inside}");
    for host_path in [home.as_str(), "/var/tmp", "/run/", "upperdir=/"] {
        assert!(!inside.contains(host_path), "the sandbox's mount table shows {host_path:?}: {inside}");
    }
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(host.contains(&home), "positive control: the host's mount table names the home");

    let uptime = |text: &str| text.split_whitespace().next().unwrap().parse::<f64>().unwrap();
    let inside_up = uptime(&sh_ok(&d, &id, "cat /proc/uptime"));
    let host_up = uptime(&std::fs::read_to_string("/proc/uptime").unwrap());
    assert!(inside_up < 120.0 && inside_up < host_up, "uptime inside {inside_up} s, on the host {host_up} s");
    if !under_gvisor() {
        let ns_inside = sh_ok(&d, &id, "readlink /proc/self/ns/time");
        let ns_host = std::fs::read_link("/proc/self/ns/time").unwrap().display().to_string();
        assert_ne!(ns_inside.trim(), ns_host, "a time namespace of its own");
    }
    destroy_clean(&d, &id);
}
