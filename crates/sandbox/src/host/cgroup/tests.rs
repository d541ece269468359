//! Detection and v2 run against sample mountinfo texts and a directory tree
//! laid out like cgroupfs; v1 (and the unified group of a hybrid host) runs
//! against the real kernel when the tests run as root.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use cairn_core::Limits;

use super::*;

const MIB: u64 = 1024 * 1024;

/// This machine's layout: v1 controllers, plus a controller-less cgroup2
/// mount at `unified`.
const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

/// A systemd host in legacy mode: cpu and cpuacct co-mounted, no cgroup2.
const V1_ONLY: &str = "\
25 21 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
28 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
34 25 0:31 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,freezer
";

/// A current distribution: one cgroup2 mount at /sys/fs/cgroup.
const PURE_V2: &str = "\
22 26 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
26 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

const NO_CGROUPS: &str = "\
22 26 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
26 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
";

fn limits(memory: &str, cpus: &str, pids: &str) -> Limits {
    let mut l = Limits::default();
    l.set_memory(memory).unwrap();
    l.set_cpus(cpus).unwrap();
    l.set_pids(pids).unwrap();
    l
}

fn read(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

fn put(path: impl AsRef<Path>, content: &str) {
    fs::write(path.as_ref(), content).unwrap();
}

// --- detection ---

#[test]
fn detects_hybrid_as_v1_with_unified() {
    let layout = CgroupLayout::from_mountinfo(HYBRID, None).unwrap();
    assert_eq!(layout.version(), CgroupVersion::V1);
    let g = layout.open("t1").unwrap();
    let p = |s: &str| PathBuf::from(format!("/sys/fs/cgroup/{s}/cairn/t1"));
    assert_eq!(g.paths(), vec![p("memory"), p("cpu"), p("pids"), p("freezer"), p("unified")]);
}

#[test]
fn detects_v1_without_unified_and_comounted_cpu() {
    let layout = CgroupLayout::from_mountinfo(V1_ONLY, None).unwrap();
    assert_eq!(layout.version(), CgroupVersion::V1);
    let g = layout.open("t1").unwrap();
    let p = |s: &str| PathBuf::from(format!("/sys/fs/cgroup/{s}/cairn/t1"));
    assert_eq!(g.paths(), vec![p("memory"), p("cpu,cpuacct"), p("pids"), p("freezer")]);
}

#[test]
fn detects_pure_v2_through_root_override() {
    let fake = FakeV2::new("cpuset cpu io memory hugetlb pids rdma misc");
    assert_eq!(fake.layout.version(), CgroupVersion::V2);
    assert_eq!(fake.layout.open("t1").unwrap().paths(), vec![fake.root.join("cairn/t1")]);
}

#[test]
fn controller_dirs_follow_the_layout() {
    let hybrid = CgroupLayout::from_mountinfo(HYBRID, None).unwrap().open("t1").unwrap();
    for (controller, dir) in [("memory", "memory"), ("cpu", "cpu"), ("pids", "pids"), ("freezer", "freezer")] {
        let want = PathBuf::from(format!("/sys/fs/cgroup/{dir}/cairn/t1"));
        assert_eq!(hybrid.controller_dir(controller), Some(want.as_path()), "{controller}");
    }
    assert_eq!(hybrid.controller_dir("unified"), None);
    assert_eq!(hybrid.controller_dir("io"), None);

    let v1 = CgroupLayout::from_mountinfo(V1_ONLY, None).unwrap().open("t1").unwrap();
    assert_eq!(v1.controller_dir("cpu"), Some(Path::new("/sys/fs/cgroup/cpu,cpuacct/cairn/t1")));
    let no_freezer = V1_ONLY.lines().filter(|l| !l.contains("freezer")).collect::<Vec<_>>().join("\n");
    let v1 = CgroupLayout::from_mountinfo(&no_freezer, None).unwrap().open("t1").unwrap();
    assert_eq!(v1.controller_dir("freezer"), None);

    // v2: one directory, for the controllers the root offers.
    let fake = FakeV2::new("memory cpu io");
    let g = fake.layout.open("t1").unwrap();
    let dir = fake.root.join("cairn/t1");
    assert_eq!((g.controller_dir("memory"), g.controller_dir("cpu")), (Some(dir.as_path()), Some(dir.as_path())));
    assert_eq!((g.controller_dir("pids"), g.controller_dir("freezer"), g.controller_dir("io")), (None, None, None));
}

#[test]
fn v1_controllers_in_one_hierarchy_are_used_once() {
    let text = "40 31 0:37 / /cg rw - cgroup cgroup rw,memory,cpu,pids,freezer\n";
    let g = CgroupLayout::from_mountinfo(text, None).unwrap().open("t1").unwrap();
    assert_eq!(g.paths(), vec![PathBuf::from("/cg/cairn/t1")]);
}

#[test]
fn refuses_hosts_without_usable_cgroups() {
    let err = CgroupLayout::from_mountinfo(NO_CGROUPS, None).unwrap_err().to_string();
    assert!(err.contains("no cgroup or cgroup2 filesystem is mounted"), "{err}");

    let no_pids = V1_ONLY.lines().filter(|l| !l.contains("pids")).collect::<Vec<_>>().join("\n");
    let err = CgroupLayout::from_mountinfo(&no_pids, None).unwrap_err().to_string();
    assert!(err.contains("no pids hierarchy"), "{err}");

    let fake = tempfile::tempdir().unwrap();
    fs::create_dir_all(fake.path().join("sys/fs/cgroup")).unwrap();
    put(fake.path().join("sys/fs/cgroup/cgroup.controllers"), "cpu io pids\n");
    let err = CgroupLayout::from_mountinfo(PURE_V2, Some(fake.path())).unwrap_err().to_string();
    assert!(err.contains("does not offer the memory controller"), "{err}");
}

#[test]
fn refuses_names_that_leave_the_parent() {
    let layout = CgroupLayout::from_mountinfo(HYBRID, None).unwrap();
    for bad in ["", ".", "..", "a/b", "../x", "a\0b"] {
        assert!(matches!(layout.open(bad), Err(Error::CgroupName(_))), "{bad:?} accepted");
        assert!(matches!(layout.create(bad, &Limits::default()), Err(Error::CgroupName(_))));
    }
}

// --- v2 against a fake cgroupfs ---

/// A temp directory laid out like a cgroup2 root: the files the kernel
/// shows, and for each new group the files `mkdir` would make.
struct FakeV2 {
    _dir: tempfile::TempDir,
    root: PathBuf,
    layout: CgroupLayout,
}

impl FakeV2 {
    fn new(controllers: &str) -> FakeV2 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("sys/fs/cgroup");
        fs::create_dir_all(&root).unwrap();
        put(root.join("cgroup.controllers"), controllers);
        put(root.join("cgroup.subtree_control"), "");
        put(root.join("cgroup.procs"), "1\n");
        let layout = CgroupLayout::from_mountinfo(PURE_V2, Some(dir.path())).unwrap();
        FakeV2 { _dir: dir, root, layout }
    }

    /// What the kernel creates on `mkdir <root>/cairn` and `mkdir
    /// <root>/cairn/<name>`, with `swap` saying whether swap accounting is on.
    fn kernel_mkdir(&self, name: &str, swap: bool) -> PathBuf {
        let parent = self.root.join("cairn");
        fs::create_dir_all(&parent).unwrap();
        if !parent.join("cgroup.subtree_control").exists() {
            put(parent.join("cgroup.subtree_control"), "");
        }
        let dir = parent.join(name);
        fs::create_dir_all(&dir).unwrap();
        for (file, content) in [
            ("cgroup.procs", ""),
            ("cgroup.kill", ""),
            ("cgroup.freeze", "0\n"),
            ("cgroup.events", "populated 0\nfrozen 0\n"),
            ("memory.max", "max\n"),
            ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"),
            ("cpu.max", "max 100000\n"),
            ("pids.max", "max\n"),
        ] {
            put(dir.join(file), content);
        }
        if swap {
            put(dir.join("memory.swap.max"), "max\n");
        }
        dir
    }
}

#[test]
fn v2_create_enables_controllers_and_writes_limits() {
    let fake = FakeV2::new("cpuset cpu io memory hugetlb pids rdma misc\n");
    let dir = fake.kernel_mkdir("t1", true);
    let group = fake.layout.create("t1", &limits("64M", "0.5", "64")).unwrap();
    assert_eq!(group.paths(), vec![dir.clone()]);
    assert_eq!(read(fake.root.join("cgroup.subtree_control")), "+memory +cpu +pids");
    assert_eq!(read(fake.root.join("cairn/cgroup.subtree_control")), "+memory +cpu +pids");
    assert_eq!(read(dir.join("memory.max")), (64 * MIB).to_string());
    assert_eq!(read(dir.join("memory.swap.max")), "0");
    assert_eq!(read(dir.join("cpu.max")), "50000 100000");
    assert_eq!(read(dir.join("pids.max")), "64");
    assert!(group.exists());
    assert_eq!(fake.layout.list().unwrap(), vec!["t1"]);
}

#[test]
fn v2_create_again_rewrites_limits_only() {
    let fake = FakeV2::new("cpu memory pids");
    let dir = fake.kernel_mkdir("t1", false);
    fake.layout.create("t1", &limits("64M", "0.5", "64")).unwrap();
    // How the kernel shows enabled controllers; nothing is left to enable,
    // so the files must not be written again.
    put(fake.root.join("cgroup.subtree_control"), "cpu memory pids\n");
    put(fake.root.join("cairn/cgroup.subtree_control"), "cpu memory pids\n");
    fake.layout.create("t1", &limits("1G", "2", "128")).unwrap();
    assert_eq!(read(fake.root.join("cgroup.subtree_control")), "cpu memory pids\n");
    assert_eq!(read(fake.root.join("cairn/cgroup.subtree_control")), "cpu memory pids\n");
    assert_eq!(read(dir.join("memory.max")), (1024 * MIB).to_string());
    assert_eq!(read(dir.join("cpu.max")), "200000 100000");
    assert_eq!(read(dir.join("pids.max")), "128");
    assert!(!dir.join("memory.swap.max").exists(), "no swap accounting: no file to write");
}

#[test]
fn v2_enables_only_offered_controllers() {
    let fake = FakeV2::new("memory cpu");
    let dir = fake.kernel_mkdir("t1", false);
    fake.layout.create("t1", &limits("64M", "1", "64")).unwrap();
    assert_eq!(read(fake.root.join("cgroup.subtree_control")), "+memory +cpu");
    assert_eq!(read(dir.join("pids.max")), "max\n", "pids is not enabled, its limit is not written");
    assert_eq!(read(dir.join("cpu.max")), "100000 100000");
}

#[test]
fn v2_missing_control_file_is_an_error_not_a_new_file() {
    let fake = FakeV2::new("cpu memory pids");
    let dir = fake.kernel_mkdir("t1", false);
    fs::remove_file(dir.join("cpu.max")).unwrap();
    let err = fake.layout.create("t1", &Limits::default()).unwrap_err();
    assert!(matches!(&err, Error::Cgroup(p, _) if p.ends_with("cpu.max")), "{err}");
    assert!(!dir.join("cpu.max").exists());
}

#[test]
fn v2_add_process_pids_and_oom_kills() {
    let fake = FakeV2::new("cpu memory pids");
    let dir = fake.kernel_mkdir("t1", false);
    let group = fake.layout.create("t1", &Limits::default()).unwrap();
    group.add_process(4242).unwrap();
    assert_eq!(read(dir.join("cgroup.procs")), "4242");
    put(dir.join("cgroup.procs"), "4242\n17\n");
    assert_eq!(group.pids().unwrap(), vec![17, 4242]);
    assert_eq!(group.oom_kills().unwrap(), 0);
    put(dir.join("memory.events"), "low 0\nhigh 0\nmax 9\noom 3\noom_kill 2\noom_group_kill 0\n");
    assert_eq!(group.oom_kills().unwrap(), 2);
}

#[test]
fn v2_freeze_waits_for_frozen_and_thaw_unfreezes() {
    let fake = FakeV2::new("cpu memory pids");
    let dir = fake.kernel_mkdir("t1", false);
    let group = fake.layout.create("t1", &Limits::default()).unwrap();

    // The events file never says frozen: the freeze times out, and undoes
    // itself.
    let err = group.freeze().unwrap_err();
    assert!(matches!(err, Error::CgroupTimeout(_, "freeze")), "{err}");
    assert_eq!(read(dir.join("cgroup.freeze")), "0");

    put(dir.join("cgroup.events"), "populated 1\nfrozen 1\n");
    group.freeze().unwrap();
    assert_eq!(read(dir.join("cgroup.freeze")), "1");
    group.thaw().unwrap();
    assert_eq!(read(dir.join("cgroup.freeze")), "0");
}

#[test]
fn v2_kill_all_writes_cgroup_kill_and_waits_for_empty() {
    let fake = FakeV2::new("cpu memory pids");
    let dir = fake.kernel_mkdir("t1", false);
    let group = fake.layout.create("t1", &Limits::default()).unwrap();
    put(dir.join("cgroup.procs"), "999999999\n");

    // Plays the kernel: empties the group once cgroup.kill is written.
    let kernel = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            for _ in 0..500 {
                if read(dir.join("cgroup.kill")) == "1" {
                    put(dir.join("cgroup.procs"), "");
                    return true;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            false
        })
    };
    group.kill_all().unwrap();
    assert!(kernel.join().unwrap(), "cgroup.kill was not written");
    assert!(group.pids().unwrap().is_empty());
}

#[test]
fn v2_kill_all_gives_up_on_a_group_that_does_not_empty() {
    let fake = FakeV2::new("cpu memory pids");
    let dir = fake.kernel_mkdir("t1", false);
    let group = fake.layout.create("t1", &Limits::default()).unwrap();
    put(dir.join("cgroup.procs"), "999999999\n");
    let start = Instant::now();
    assert!(matches!(group.kill_all(), Err(Error::CgroupBusy(p)) if p == dir));
    assert!(start.elapsed() < KILL_TIMEOUT + Duration::from_secs(1));
}

#[test]
fn removing_an_absent_group_is_ok() {
    let fake = FakeV2::new("cpu memory pids");
    let group = fake.layout.open("never-created").unwrap();
    assert!(!group.exists());
    group.remove().unwrap();
    assert!(fake.layout.list().unwrap().is_empty());
    assert!(CgroupLayout::from_mountinfo(HYBRID, None).unwrap().open("t1").is_ok());
}

// --- the real kernel ---

mod real {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// Removes the group when the test ends, passed or not.
    struct Guard(TaskCgroup);

    impl Drop for Guard {
        fn drop(&mut self) {
            if let Err(e) = self.0.remove() {
                eprintln!("cleanup of {:?} failed: {e}", self.0.paths());
            }
        }
    }

    impl std::ops::Deref for Guard {
        type Target = TaskCgroup;
        fn deref(&self) -> &TaskCgroup {
            &self.0
        }
    }

    /// A name no other test (or earlier run) uses.
    fn unique(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!("test-{}-{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
    }

    /// The host's layout, or `None` (and a note) when these tests cannot
    /// run here.
    fn host() -> Option<CgroupLayout> {
        assert!(nix::unistd::geteuid().is_root(), "the real-kernel cgroup tests must run as root");
        match CgroupLayout::detect() {
            Ok(layout) => Some(layout),
            Err(e) => panic!("the real-kernel cgroup tests need a cgroup hierarchy: {e}"),
        }
    }

    /// The host's layout without its cgroup2 mount: a v1 host that must kill
    /// and freeze through the v1 freezer.
    fn host_v1_only() -> Option<CgroupLayout> {
        host().filter(|l| l.version() == CgroupVersion::V1)?;
        let text = read("/proc/self/mountinfo");
        let text: String = text.lines().filter(|l| !l.contains(" - cgroup2 ")).map(|l| format!("{l}\n")).collect();
        CgroupLayout::from_mountinfo(&text, None).ok()
    }

    fn sleeper() -> Child {
        Command::new("sleep").arg("30").spawn().unwrap()
    }

    /// A shell that waits for a line on stdin, then execs `cmd`: the child
    /// can be moved into a group before it starts doing anything.
    fn held(cmd: &str) -> Child {
        Command::new("sh")
            .args(["-c", &format!("read _ && exec {cmd}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn release(child: &mut Child) {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }

    #[test]
    fn real_create_applies_limits() {
        let Some(layout) = host() else { return };
        let g = Guard(layout.create(&unique("limits"), &limits("64M", "0.5", "64")).unwrap());
        assert!(g.exists());
        match &g.0.dirs {
            Hierarchies::V1 { memory, cpu, pids, .. } => {
                assert_eq!(read(memory.join("memory.limit_in_bytes")).trim(), (64 * MIB).to_string());
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    assert_eq!(read(memsw).trim(), (64 * MIB).to_string());
                }
                assert_eq!(read(cpu.join("cpu.cfs_period_us")).trim(), "100000");
                assert_eq!(read(cpu.join("cpu.cfs_quota_us")).trim(), "50000");
                assert_eq!(read(pids.join("pids.max")).trim(), "64");
            }
            Hierarchies::V2 { dir, .. } => {
                assert_eq!(read(dir.join("memory.max")).trim(), (64 * MIB).to_string());
                assert_eq!(read(dir.join("cpu.max")).trim(), "50000 100000");
                assert_eq!(read(dir.join("pids.max")).trim(), "64");
            }
        }
        // Raising and lowering again (the memsw ordering) both work.
        layout.create(g.name(), &limits("256M", "2", "64")).unwrap();
        layout.create(g.name(), &limits("32M", "2", "64")).unwrap();
        assert!(layout.list().unwrap().contains(&g.name().to_owned()));
    }

    #[test]
    fn real_process_is_tracked_killed_and_group_removed() {
        let Some(layout) = host() else { return };
        let g = Guard(layout.create(&unique("kill"), &Limits::default()).unwrap());
        let mut child = sleeper();
        let pid = child.id() as i32;
        g.add_process(pid).unwrap();
        assert_eq!(g.pids().unwrap(), vec![pid]);
        for dir in g.paths() {
            assert!(read(dir.join("cgroup.procs")).split_whitespace().any(|p| p == pid.to_string()), "{dir:?}");
        }
        g.kill_all().unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(g.pids().unwrap().is_empty());
        g.remove().unwrap();
        assert!(!g.exists());
        for dir in g.paths() {
            assert!(!dir.exists(), "{dir:?} left behind");
        }
        assert!(!layout.list().unwrap().contains(&g.name().to_owned()));
        g.remove().unwrap();
    }

    #[test]
    fn real_remove_kills_what_is_left() {
        let Some(layout) = host() else { return };
        let g = Guard(layout.create(&unique("remove"), &Limits::default()).unwrap());
        let mut children = [sleeper(), sleeper()];
        for c in &children {
            g.add_process(c.id() as i32).unwrap();
        }
        g.remove().unwrap();
        for c in &mut children {
            assert_eq!(c.wait().unwrap().signal(), Some(libc::SIGKILL));
        }
        assert!(!g.exists());
    }

    #[test]
    fn real_open_finds_an_existing_group() {
        let Some(layout) = host() else { return };
        let name = unique("open");
        let g = Guard(layout.create(&name, &Limits::default()).unwrap());
        let mut child = sleeper();
        g.add_process(child.id() as i32).unwrap();
        // As after a daemon restart: only the name is known.
        let again = layout.open(&name).unwrap();
        assert!(again.exists());
        assert_eq!(again.pids().unwrap(), vec![child.id() as i32]);
        again.remove().unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(!g.exists());
    }

    #[test]
    fn real_kill_reaches_a_process_missing_from_the_unified_group() {
        let Some(layout) = host() else { return };
        let g = Guard(layout.create(&unique("partial"), &Limits::default()).unwrap());
        let memory = match &g.0.dirs {
            Hierarchies::V1 { memory, unified: Some(_), .. } => memory.clone(),
            // Legacy v1: no unified group a process could be missing from;
            // real_v1_freezer_freeze_and_kill covers the kill.
            Hierarchies::V1 { unified: None, .. } => {
                assert_eq!(g.v2_dir(), None);
                assert!(!read("/proc/self/mountinfo").contains(" - cgroup2 "), "a cgroup2 mount the layout left out");
                return;
            }
            // Pure v2: one group, so a process is in all of it or none.
            Hierarchies::V2 { dir, .. } => {
                assert_eq!(g.paths(), vec![dir.clone()]);
                assert!(dir.join("cgroup.kill").exists(), "kernels before 5.14 have no cgroup.kill");
                return;
            }
        };
        // As if add_process had failed after the first hierarchy.
        let mut child = sleeper();
        put(memory.join("cgroup.procs"), &child.id().to_string());
        assert_eq!(g.pids().unwrap(), vec![child.id() as i32]);
        g.kill_all().unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn real_freeze_and_thaw() {
        let Some(layout) = host() else { return };
        let g = Guard(layout.create(&unique("freeze"), &Limits::default()).unwrap());
        let Some(v2) = g.v2_freezer() else {
            // Only legacy v1 (no cgroup2 mount) lacks it, and freezes
            // through the v1 freezer: real_v1_freezer_freeze_and_kill.
            assert!(matches!(g.0.dirs, Hierarchies::V1 { unified: None, freezer: Some(_), .. }), "{:?}", g.paths());
            return;
        };
        let mut child = sleeper();
        g.add_process(child.id() as i32).unwrap();
        g.freeze().unwrap();
        // A hybrid host must use the unified group, not the v1 freezer.
        assert!(read(v2.join("cgroup.events")).contains("frozen 1"));
        if let Some(v1) = g.v1_freezer() {
            assert_eq!(read(v1.join("freezer.state")).trim(), "THAWED");
        }
        g.thaw().unwrap();
        let events = v2.join("cgroup.events");
        assert!(wait_until(Duration::from_secs(1), || Ok(read(&events).contains("frozen 0"))).unwrap());
        g.kill_all().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn real_v1_freezer_freeze_and_kill() {
        let Some(layout) = host_v1_only() else {
            // Pure v2 has no v1 freezer; real_freeze_and_thaw covers its own.
            assert_eq!(host().map(|l| l.version()), Some(CgroupVersion::V2));
            return;
        };
        let g = Guard(layout.create(&unique("v1kill"), &Limits::default()).unwrap());
        assert!(g.v2_dir().is_none());
        let freezer = g.v1_freezer().expect("the host has a v1 freezer").to_owned();
        let mut child = sleeper();
        g.add_process(child.id() as i32).unwrap();
        g.freeze().unwrap();
        assert_eq!(read(freezer.join("freezer.state")).trim(), "FROZEN");
        g.thaw().unwrap();
        assert_eq!(read(freezer.join("freezer.state")).trim(), "THAWED");
        // A frozen group: the kill must thaw it for the signal to land.
        g.freeze().unwrap();
        g.kill_all().unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert_eq!(read(freezer.join("freezer.state")).trim(), "THAWED");
        g.remove().unwrap();
        assert!(!g.exists());
    }

    #[test]
    fn real_oom_kill_is_counted() {
        let Some(layout) = host() else { return };
        let g = Guard(layout.create(&unique("oom"), &limits("32M", "1", "64")).unwrap());
        assert_eq!(g.oom_kills().unwrap(), 0);

        // dd allocates a buffer of `bs` bytes and fills it from /dev/zero.
        let mut small = held("dd if=/dev/zero of=/dev/null bs=1M count=4");
        g.add_process(small.id() as i32).unwrap();
        release(&mut small);
        let status = small.wait().unwrap();
        assert!(status.success(), "a small allocation must fit: {status:?}");
        assert_eq!(g.oom_kills().unwrap(), 0);

        let mut big = held("dd if=/dev/zero of=/dev/null bs=200M count=1");
        g.add_process(big.id() as i32).unwrap();
        release(&mut big);
        let status = big.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert_eq!(g.oom_kills().unwrap(), 1);
    }
}
