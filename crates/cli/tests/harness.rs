//! The harness's own guarantees: a CLI call that hangs fails with its
//! command and output, and the leak scanner finds what a task could leave
//! (each finding paired with the clean case).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{leaks, try_output_within};

#[test]
fn a_call_past_its_deadline_fails_with_what_it_printed() {
    let err = try_output_within(Command::new("sh").args(["-c", "echo started; sleep 30"]), Duration::from_millis(300)).unwrap_err();
    assert!(err.contains("did not finish within") && err.contains("started"), "{err}");
    let ok = try_output_within(Command::new("sh").args(["-c", "echo done"]), Duration::from_secs(30)).expect("finishes");
    assert_eq!(ok.stdout, b"done\n");
}

/// Removes what the test planted, also when it fails.
struct Planted {
    mount: Option<PathBuf>,
    paths: Vec<PathBuf>,
}

impl Drop for Planted {
    fn drop(&mut self) {
        if let Some(m) = self.mount.take() {
            let _ = Command::new("umount").arg(&m).status();
        }
        for p in self.paths.iter().rev() {
            let _ = std::fs::remove_dir(p).or_else(|_| std::fs::remove_file(p));
        }
    }
}

#[test]
fn the_leak_scanner_finds_mounts_cgroups_slots_and_scratch() {
    common::require_root();
    let home = tempfile::Builder::new().prefix("cairn-scan-").tempdir_in("/var/tmp").expect("home");
    let task = format!("tscan{}", std::process::id());
    let tasks = vec![task.clone()];
    assert_eq!(leaks::scan(home.path(), &tasks), Vec::<String>::new(), "a clean home has no findings");

    let run = home.path().join("run").join(&task);
    std::fs::create_dir_all(&run).expect("run dir");
    let mut planted = Planted { mount: None, paths: Vec::new() };
    assert!(Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(&run).status().expect("mount").success());
    planted.mount = Some(run.clone());
    // A cgroup named for the task in the first hierarchy that takes one.
    let cgroup = ["pids", "memory", "unified", ""]
        .iter()
        .map(|h| Path::new("/sys/fs/cgroup").join(h).join(format!("cairn-{task}")))
        .find(|p| std::fs::create_dir(p).is_ok())
        .expect("a cgroup hierarchy to create a test cgroup in");
    planted.paths.push(cgroup.clone());
    std::fs::create_dir_all("/run/cairn/uid-slots").expect("slot dir");
    let slot = Path::new("/run/cairn/uid-slots").join(format!("test-{task}"));
    std::fs::write(&slot, format!("{task}\n")).expect("slot");
    planted.paths.push(slot.clone());

    let found = leaks::scan(home.path(), &tasks).join("\n");
    assert!(found.contains("mount left") && found.contains(&run.display().to_string()), "{found}");
    assert!(found.contains(&format!("cgroup left: {}", cgroup.display())), "{found}");
    assert!(found.contains(&format!("uid slot left: {}", slot.display())), "{found}");
    assert!(found.contains(&format!("scratch left: {}", run.display())), "{found}");

    drop(planted);
    std::fs::remove_dir(&run).expect("remove run dir");
    assert_eq!(leaks::scan(home.path(), &tasks), Vec::<String>::new(), "clean again once removed");
}
