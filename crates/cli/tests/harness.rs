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
            let _ = common::run(Command::new("umount").arg(&m));
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
    assert!(common::run(Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(&run)).expect("mount").status.success());
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

/// Where a test file waits for a process without the harness's deadline:
/// a bare `.output()` or `.wait_with_output()`, or a `.status()` of a
/// `Command` (same line, or a chained line of its own). Comments aside.
fn bare_waits(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            // A method call, not the name in a string (`".output()"`).
            let called = |m: &str| l.match_indices(m).any(|(i, _)| !l[..i].ends_with('"'));
            called(".output()")
                || called(".wait_with_output()")
                || (called(".status()") && (l.contains("Command::new(") || l.trim() == ".status()"))
        })
        .map(|(n, l)| (n + 1, l.trim().to_owned()))
        .collect()
}

/// Every process a test runs to its end goes through a deadline
/// (`common::run`, `output_within`, `output_of`): a test that hangs fails
/// with what it printed instead of holding CI until its own timeout.
#[test]
fn no_test_waits_for_a_process_without_a_deadline() {
    // The check finds each form, and passes the harness's own.
    // (Written with `#` for the dot, so that this file passes its own check.)
    let planted = "let a = Command::new(\"x\")#output();\nlet b = child#wait_with_output();\nlet c = Command::new(\"y\")#status();\n    #status()\n// #output() in a comment\nlet d = common::run(Command::new(\"z\"));\nlet e = resp#status()#as_u16();";
    assert_eq!(bare_waits(&planted.replace('#', ".")).iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.extend(std::fs::read_dir(dir.join("common")).unwrap().map(|e| e.unwrap().path()));
    let mut found = Vec::new();
    let mut scanned = 0;
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        scanned += 1;
        for (n, line) in bare_waits(&std::fs::read_to_string(f).unwrap()) {
            found.push(format!("{}:{n}: {line}", f.display()));
        }
    }
    assert!(scanned > 30, "the test files were found ({scanned})");
    assert!(found.is_empty(), "processes waited for without a deadline:\n{}", found.join("\n"));
}
