//! A task's whole life through the real CLI: exec (streams, exit codes,
//! stdin, pty, env, workdir, steps), cp both ways, show/list/log, destroy,
//! a daemon restart with one sandbox killed meanwhile (recovered), one daemon per home,
//! the config file, and images.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::Value;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn pid_of(d: &Daemon, id: &str) -> i32 {
    d.task(id)["sandbox_pid"].as_i64().expect("a running task has a sandbox pid") as i32
}

/// Waits for `child` at most `limit`; kills it and panics if it is still
/// running then.
fn wait_output(mut child: std::process::Child, limit: Duration, what: &str) -> std::process::Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return common::output_of(child, common::CALL_DEADLINE).expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = common::output_of(child, common::CALL_DEADLINE).expect("output");
            panic!("{what} still running after {limit:?}; stdout {:?} stderr {:?}", text(&out.stdout), text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kinds(log: &Value) -> Vec<String> {
    log.as_array().expect("log is a list").iter().map(|e| e["kind"].as_str().unwrap_or_default().to_owned()).collect()
}

#[test]
fn exec_streams_stdout_and_stderr_separately() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let (code, out, err) = d.sh(&id, "echo out; echo err >&2");
    assert_eq!((code, out.as_str(), err.as_str()), (0, "out\n", "err\n"));
}

#[test]
fn exec_output_arrives_while_the_command_runs() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let begun = Instant::now();
    let mut child = d
        .cmd()
        .args(["exec", &id, "--", "sh", "-c", "echo first; sleep 3; echo second"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn exec");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = Vec::new();
    let mut line = String::new();
    while lines.read_line(&mut line).expect("read") > 0 {
        seen.push((line.clone(), begun.elapsed()));
        line.clear();
    }
    let status = child.wait().expect("wait");
    let ended = begun.elapsed();
    assert!(status.success(), "exec failed: {status}");
    assert_eq!(seen.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(), ["first\n", "second\n"]);
    let (first, second) = (seen[0].1, seen[1].1);
    assert!(ended >= Duration::from_secs(3), "the command sleeps 3s, exec ended after {ended:?}");
    assert!(second - first >= Duration::from_millis(2500), "first at {first:?}, second at {second:?}: first was held back");
    assert!(ended - first >= Duration::from_millis(2500), "first arrived at {first:?}, only shortly before the end at {ended:?}");
}

#[test]
fn exec_exit_codes() {
    let d = Daemon::start();
    let id = d.create(&[]);
    assert_eq!(d.sh(&id, "exit 3").0, 3);
    assert_eq!(d.sh(&id, "exit 0").0, 0, "positive control");
    assert_eq!(d.sh(&id, "kill -9 $$").0, 137, "killed by SIGKILL is 128+9");

    // Sleeps running in the sandbox, counted from /proc (no ps needed).
    let sleeps = |d: &Daemon| d.sh(&id, "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -xc sleep; true").1.trim().to_owned();
    assert_eq!(sleeps(&d), "0");
    // Positive control: the count sees a sleep that is running.
    assert_eq!(d.sh(&id, "setsid -f sleep 30; true").0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleeps(&d) != "1" {
        assert!(Instant::now() < deadline, "the background sleep never showed: {}", sleeps(&d));
    }
    assert_eq!(d.sh(&id, "pkill -x sleep || kill $(for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = sleep ] && basename $p; done)").0, 0);

    let begun = Instant::now();
    let out = d.cairn(&["exec", "--timeout", "1s", &id, "--", "sh", "-c", "sleep 10 & sleep 10"]);
    let took = begun.elapsed();
    assert_eq!(out.status.code(), Some(124), "timeout exit code; stderr {:?}", text(&out.stderr));
    assert!(took < Duration::from_secs(5), "the timeout took {took:?}");
    assert!(text(&out.stderr).lines().any(|l| l.contains("timed out")), "stderr: {:?}", text(&out.stderr));
    // Its processes are killed; the sandbox's init may take a moment to reap them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleeps(&d) != "0" {
        assert!(Instant::now() < deadline, "a timed-out command leaves no process behind, its children included");
    }

    let out = d.cairn(&["exec", &id, "--", "no-such-command-here"]);
    assert_eq!(out.status.code(), Some(127));
    let err = text(&out.stderr);
    assert!(err.contains("cannot run") && err.contains("no-such-command-here"), "stderr: {err:?}");

    // The sandbox is still fine after all that.
    assert_eq!(d.sh(&id, "echo still here"), (0, "still here\n".into(), String::new()));
}

#[test]
fn exec_stdin_only_with_i() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let run = |extra: &[&str], input: Option<&[u8]>| {
        let mut args = vec!["exec"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[&id, "--", "cat"]);
        let mut child =
            d.cmd().args(&args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
        let mut stdin = child.stdin.take().expect("stdin");
        if let Some(input) = input {
            stdin.write_all(input).expect("write stdin");
        }
        drop(stdin);
        wait_output(child, Duration::from_secs(20), "cairn exec ... cat")
    };
    let with = run(&["-i"], Some(b"hello\n"));
    assert!(with.status.success(), "{:?}", text(&with.stderr));
    assert_eq!(text(&with.stdout), "hello\n");
    // Piped input without -i is refused, not dropped: nothing runs.
    let without = run(&[], Some(b"hello\n"));
    let err = text(&without.stderr);
    assert_eq!(without.status.code(), Some(1), "{err:?}");
    assert!(err.contains("stdin is a pipe with input waiting") && err.contains("pass -i") && err.lines().count() == 1, "{err:?}");
    assert_eq!(text(&without.stdout), "");
    // An empty pipe, a file read to its end and /dev/null hold nothing to drop: the command runs without stdin.
    let empty = run(&[], None);
    assert!(empty.status.success() && text(&empty.stdout).is_empty(), "{:?}", text(&empty.stderr));
    let file = d.home().join("input.txt");
    std::fs::write(&file, "from a file\n").unwrap();
    let from_file = |extra: &[&str], skip_to_end: bool| {
        let mut f = std::fs::File::open(&file).unwrap();
        if skip_to_end {
            std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap();
        }
        let mut args = vec!["exec"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[&id, "--", "cat"]);
        common::output_within(d.cmd().args(&args).stdin(f), Duration::from_secs(20))
    };
    let refused = from_file(&[], false);
    assert!(!refused.status.success() && text(&refused.stderr).contains("stdin is a file with input waiting"), "{:?}", text(&refused.stderr));
    let read = from_file(&[], true);
    assert!(read.status.success() && text(&read.stdout).is_empty(), "{:?}", text(&read.stderr));
    let given = from_file(&["-i"], false);
    assert_eq!(text(&given.stdout), "from a file\n", "{:?}", text(&given.stderr));
    let null = common::output_within(d.cmd().args(["exec", &id, "--", "cat"]).stdin(Stdio::null()), Duration::from_secs(20));
    assert!(null.status.success() && text(&null.stdout).is_empty(), "{:?}", text(&null.stderr));
    // -t wants a terminal on stdin: with a pipe it is refused at once, never left hanging.
    let tty = run(&["-it"], Some(b"hello\n"));
    let err = text(&tty.stderr);
    assert!(!tty.status.success() && err.contains("-t needs a terminal on stdin"), "{err:?}");
}

#[test]
fn exec_tty_gets_a_pty() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let inner = format!("{} exec -t {id} -- sh -c 'tty; stty size'", common::CAIRN);
    let child = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("CAIRN_HOME", d.home())
        .env_remove("CAIRN_URL")
        .env_remove("CAIRN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux is needed");
    let out = wait_output(child, Duration::from_secs(20), "cairn exec -t under script");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout:?} {:?}", text(&out.stderr));
    let lines: Vec<&str> = stdout.split(['\r', '\n']).map(|l| l.trim_start_matches("^@").trim()).filter(|l| !l.is_empty()).collect();
    assert!(
        lines.iter().any(|l| l.starts_with("/dev/pts/") && l["/dev/pts/".len()..].parse::<u32>().is_ok()),
        "no /dev/pts/N in {stdout:?}"
    );
    assert!(
        lines.iter().any(|l| { let n: Vec<_> = l.split(' ').collect(); n.len() == 2 && n.iter().all(|x| x.parse::<u32>().is_ok_and(|v| v > 0)) }),
        "no 'rows cols' from stty size in {stdout:?}"
    );
    // Positive control of the difference: without -t there is no terminal.
    let (code, out, _) = d.sh(&id, "tty");
    assert_eq!(code, 1, "tty(1) exits 1 without a terminal");
    assert!(out.contains("not a tty"), "{out:?}");
}

#[test]
fn each_exec_is_a_step() {
    let d = Daemon::start();
    let id = d.create(&[]);
    assert_eq!(d.task(&id)["step"], 0);
    for n in 1..=3 {
        assert_eq!(d.sh(&id, "true").0, 0);
        assert_eq!(d.task(&id)["step"], n);
    }
    // A failing command is a step too.
    assert_eq!(d.sh(&id, "exit 1").0, 1);
    assert_eq!(d.task(&id)["step"], 4);
}

#[test]
fn env_and_workdir_on_create_and_exec() {
    let d = Daemon::start();
    let plain = d.create(&[]);
    let (code, out, _) = d.sh(&plain, "pwd; ls -A; test -d /workspace && echo isdir");
    assert_eq!((code, out.as_str()), (0, "/workspace\nisdir\n"), "default workdir /workspace, existing and empty");

    let id = d.create(&["--env", "A=one", "--env", "B=two", "--workdir", "/srv/work"]);
    let (_, out, _) = d.sh(&id, "echo \"$A $B\"; pwd");
    assert_eq!(out, "one two\n/srv/work\n");
    let shown = d.task(&id);
    assert_eq!(shown["config"]["workdir"], "/srv/work");
    assert_eq!(shown["config"]["env"][0]["key"], "A");

    let out = d.ok(&["exec", "--env", "B=three", "--env", "C=four", "--workdir", "/tmp", &id, "--", "sh", "-c", "echo \"$A $B $C\"; pwd"]);
    assert_eq!(out, "one three four\n/tmp\n", "exec env overrides the task's; exec workdir overrides the task's");
    // The next exec is back to the task's own.
    assert_eq!(d.sh(&id, "echo \"$A $B $C\"; pwd").1, "one two \n/srv/work\n");
    assert_eq!(d.sh(&plain, "echo \"[$A]\"").1, "[]\n", "env is per task");
}

#[test]
fn cp_files_and_directories_both_ways() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("tree");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("top.txt"), "top\n").unwrap();
    std::fs::write(src.join("sub/deeper/leaf.txt"), "leaf\n").unwrap();
    symlink("sub/deeper/leaf.txt", src.join("link")).unwrap();
    let file = local.path().join("single.txt");
    std::fs::write(&file, "single file\n").unwrap();

    // Into an existing directory: lands inside it, by its own name.
    d.ok(&["cp", src.to_str().unwrap(), &format!("{id}:/workspace/")]);
    d.ok(&["cp", file.to_str().unwrap(), &format!("{id}:/workspace")]);
    // To a new name: copied as that name.
    d.ok(&["cp", file.to_str().unwrap(), &format!("{id}:/workspace/renamed.txt")]);
    // Into directories not there yet: they are made (all of a path ending in /).
    d.ok(&["cp", src.to_str().unwrap(), &format!("{id}:/workspace/new/dir/")]);
    d.ok(&["cp", file.to_str().unwrap(), &format!("{id}:/workspace/other/named.txt")]);
    assert_eq!(d.sh(&id, "cat /workspace/new/dir/tree/top.txt /workspace/other/named.txt").1, "top\nsingle file\n");
    let (code, out, err) = d.sh(
        &id,
        "cd /workspace; cat tree/top.txt tree/sub/deeper/leaf.txt single.txt renamed.txt; readlink tree/link; test -L tree/link && echo symlink; cat tree/link",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "top\nleaf\nsingle file\nsingle file\nsub/deeper/leaf.txt\nsymlink\nleaf\n");

    // Out again: made in the sandbox, copied here.
    d.sh(&id, "mkdir -p /workspace/made/a/b && echo made > /workspace/made/a/b/f && ln -s a/b/f /workspace/made/l && echo one > /workspace/one.txt");
    let back = local.path().join("back");
    d.ok(&["cp", &format!("{id}:/workspace/made"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(back.join("a/b/f")).unwrap(), "made\n");
    let l = back.join("l");
    assert!(std::fs::symlink_metadata(&l).unwrap().file_type().is_symlink(), "symlink kept as a symlink");
    assert_eq!(std::fs::read_link(&l).unwrap(), PathBuf::from("a/b/f"));
    // Into an existing local directory: lands inside it.
    let existing = local.path().join("existing");
    std::fs::create_dir(&existing).unwrap();
    d.ok(&["cp", &format!("{id}:/workspace/made"), existing.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(existing.join("made/a/b/f")).unwrap(), "made\n");
    d.ok(&["cp", &format!("{id}:/workspace/one.txt"), existing.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(existing.join("one.txt")).unwrap(), "one\n");
    let single = local.path().join("one-renamed.txt");
    d.ok(&["cp", &format!("{id}:/workspace/one.txt"), single.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&single).unwrap(), "one\n");
    // The tree that went in comes back out the same.
    let round = local.path().join("round");
    d.ok(&["cp", &format!("{id}:/workspace/tree"), round.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(round.join("sub/deeper/leaf.txt")).unwrap(), "leaf\n");
    assert_eq!(std::fs::read_link(round.join("link")).unwrap(), PathBuf::from("sub/deeper/leaf.txt"));
}

#[test]
fn show_list_and_log() {
    let d = Daemon::start();
    let before = Instant::now();
    let id = d.create(&["--name", "showme"]);
    let t = d.task(&id);
    assert_eq!(t["state"], "running");
    assert_eq!(t["sandbox"], "ready");
    assert_eq!(t["config"]["image"], "host");
    assert_eq!(t["name"], "showme");
    assert_eq!(t["step"], 0);
    assert_eq!(t["limits"]["memory"], "512M");
    assert_eq!(t["limits"]["cpus"], "1");
    assert_eq!(t["limits"]["pids"], 256);
    assert_eq!(t["limits"]["disk"], "2G");
    assert!(t["memory"].is_string(), "memory summary field: {t}");
    let created = t["created_ms"].as_i64().unwrap();
    assert!(created > 1_600_000_000_000 && t["last_activity_ms"].as_i64().unwrap() >= created, "{t}");
    assert!(t["sandbox_pid"].as_i64().unwrap() > 1);
    // By name, the same task.
    assert_eq!(d.task("showme")["id"], id.as_str());

    let human = d.ok(&["task", "show", &id]);
    for want in [
        format!("id:            {id}"),
        "name:          showme".into(),
        "state:         running".into(),
        "sandbox:       ready".into(),
        "image:         host".into(),
        "limits:        memory 512M, cpus 1, pids 256, disk 2G".into(),
        "step:          0".into(),
        "workdir:       /workspace".into(),
    ] {
        assert!(human.lines().any(|l| l == want), "no line {want:?} in:\n{human}");
    }
    for key in ["memory:", "created:", "last activity:"] {
        let line = human.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in:\n{human}"));
        if key != "memory:" {
            assert!(line.contains("20") && line.ends_with('Z'), "{line:?} is not a time");
        }
    }

    assert_eq!(d.sh(&id, "exit 5").0, 5);
    let shown = d.task(&id);
    assert_eq!(shown["step"], 1);
    assert!(shown["last_activity_ms"].as_i64().unwrap() >= created);

    let list = d.json(&["task", "list"]);
    let arr = list.as_array().unwrap();
    assert_eq!(arr.len(), 1);
    assert_eq!(arr[0]["id"], id.as_str());
    assert_eq!(arr[0]["state"], "running");
    let table = d.ok(&["task", "list"]);
    let mut rows = table.lines();
    let header: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["ID", "NAME", "STATE", "SANDBOX", "IMAGE", "STEP", "CREATED"]);
    let row: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..6], [id.as_str(), "showme", "running", "ready", "host", "1"]);

    // The log: create, sandbox_start, exec, cp, destroy, in order.
    let f = tempfile::NamedTempFile::new().unwrap();
    d.ok(&["cp", f.path().to_str().unwrap(), &format!("{id}:/workspace/f")]);
    d.ok(&["destroy", &id]);
    let log = d.json(&["log", &id]);
    assert_eq!(kinds(&log), ["create", "sandbox_start", "exec", "cp", "destroy"]);
    let ev = log.as_array().unwrap();
    for (i, e) in ev.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1);
        assert_eq!(e["task"], id.as_str());
        assert!(e["actor"].as_str().unwrap().starts_with("cli:"), "{e}");
        assert!(e["time_ms"].as_i64().unwrap() >= created, "{e}");
    }
    assert!(ev.windows(2).all(|w| w[0]["time_ms"].as_i64() <= w[1]["time_ms"].as_i64()));
    let exec = &ev[2];
    assert_eq!(exec["exit_code"], 5);
    assert!(exec["duration_ms"].is_u64(), "{exec}");
    assert_eq!(exec["args"]["argv"], serde_json::json!(["sh", "-c", "exit 5"]));
    assert_eq!(ev[3]["exit_code"], 0);
    assert_eq!(ev[3]["args"]["direction"], "in");
    assert_eq!(ev[4]["exit_code"], 0);
    assert!(before.elapsed() < Duration::from_secs(60));

    let human = d.ok(&["log", &id]);
    let lines: Vec<&str> = human.lines().collect();
    assert!(lines[0].starts_with("SEQ") && lines[0].contains("KIND") && lines[0].contains("ACTOR"), "{human}");
    let got: Vec<&str> = lines[1..].iter().map(|l| l.split_whitespace().nth(2).unwrap_or_default()).collect();
    assert_eq!(got, ["create", "sandbox_start", "exec", "cp", "destroy"], "{human}");
    let exec_row: Vec<&str> = lines[3].split_whitespace().collect();
    assert!(exec_row[3].starts_with("cli:") && exec_row[4] == "5" && exec_row[5].ends_with("ms"), "{:?}", lines[3]);
}

#[test]
fn destroy_leaves_nothing_but_the_record() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let other = d.create(&[]);
    d.sh(&id, "echo data > /workspace/x");
    let pid = pid_of(&d, &id);
    let out = d.ok(&["destroy", &id]);
    assert_eq!(out.trim(), format!("destroyed {id}"));
    assert_eq!(d.leftovers(&id, pid), Vec::<String>::new());
    let t = d.task(&id);
    assert_eq!(t["state"], "destroyed");
    assert_eq!(t["sandbox"], "none");
    assert!(t["sandbox_pid"].is_null());
    assert_eq!(kinds(&d.json(&["log", &id])).last().map(String::as_str), Some("destroy"));
    let err = d.fails(&["exec", &id, "--", "true"]);
    assert!(err.contains("destroyed"), "{err}");
    // The other task is untouched.
    assert_eq!(d.sh(&other, "echo alive").1, "alive\n");
    assert_eq!(d.task(&other)["state"], "running");
}

#[test]
fn daemon_restart_keeps_tasks_and_recovers_lost_sandboxes() {
    let mut d = Daemon::start();
    let keep = d.create(&["--name", "keeper"]);
    let lose = d.create(&["--name", "loser"]);
    for (id, word) in [(&keep, "kept"), (&lose, "lost")] {
        assert_eq!(d.sh(id, &format!("echo {word} > /workspace/file")).0, 0);
    }
    d.sh(&keep, "true");
    let keep_step = d.task(&keep)["step"].as_u64().unwrap();
    assert_eq!(keep_step, 2);
    let keep_pid = pid_of(&d, &keep);
    let lose_pid = pid_of(&d, &lose);
    let keep_log = d.json(&["log", &keep]);
    let lose_log = d.json(&["log", &lose]);

    d.kill();
    // SAFETY: kill with a pid this test observed as the sandbox's init.
    assert_eq!(unsafe { libc::kill(lose_pid, libc::SIGKILL) }, 0);
    common::reap(lose_pid);
    assert!(!Path::new(&format!("/proc/{lose_pid}")).exists(), "init {lose_pid} still there");
    d.spawn(&[]);

    let list = d.json(&["task", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(d.json(&["log", &keep]), keep_log, "the survivor's log is whole and unchanged");
    let lose_log_after = d.json(&["log", &lose]);
    assert_eq!(lose_log_after.as_array().unwrap()[..lose_log.as_array().unwrap().len()], lose_log.as_array().unwrap()[..]);
    let after: Vec<String> = kinds(&lose_log_after)[lose_log.as_array().unwrap().len()..].to_vec();
    assert_eq!(after, ["sandbox_lost", "sandbox_start", "recovered"], "noticed, then rebuilt");

    let k = d.task(&keep);
    assert_eq!((k["state"].as_str(), k["sandbox"].as_str()), (Some("running"), Some("ready")));
    assert_eq!(k["sandbox_pid"].as_i64(), Some(keep_pid as i64));
    assert_eq!(k["step"].as_u64(), Some(keep_step));
    assert_eq!(d.sh(&keep, "cat /workspace/file").1, "kept\n");
    assert_eq!(d.task(&keep)["step"].as_u64(), Some(keep_step + 1));
    assert!(k["recovery_note"].is_null(), "a sandbox that survived needs no recovery");

    // The lost one runs again in a fresh sandbox. It has no snapshot, so its
    // writable layer is as the kill left it; the note says so.
    let l = d.task(&lose);
    assert_eq!((l["state"].as_str(), l["sandbox"].as_str()), (Some("running"), Some("ready")));
    assert_ne!(l["sandbox_pid"].as_i64(), Some(lose_pid as i64));
    let note = l["recovery_note"].as_str().unwrap_or_default();
    assert!(note.contains("no snapshot"), "a recovered task says what happened: {l}");
    assert!(d.ok(&["task", "show", &lose]).contains(&format!("recovery:      {note}")));
    assert_eq!(d.sh(&lose, "cat /workspace/file").1, "lost\n");
    let lose_pid = pid_of(&d, &lose);

    d.ok(&["destroy", &keep]);
    d.ok(&["destroy", &lose]);
    assert_eq!(d.leftovers(&keep, keep_pid), Vec::<String>::new());
    assert_eq!(d.leftovers(&lose, lose_pid), Vec::<String>::new());
    assert_eq!(kinds(&d.json(&["log", &keep])).last().map(String::as_str), Some("destroy"));
}

#[test]
fn one_daemon_per_home() {
    let d = Daemon::start();
    let url = d.url.clone();
    let second = Command::new(common::CAIRN)
        .args(["serve", "--listen", "127.0.0.1:0", "--disk-pool", "0"])
        .env("CAIRN_HOME", d.home())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(second, Duration::from_secs(20), "a second cairn serve on the same home");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("already running"), "{err}");
    assert!(err.contains(&d.pid().to_string()), "names the running daemon's pid: {err}");
    // The first one is untouched and still serves.
    assert_eq!(std::fs::read_to_string(d.home().join("url")).unwrap().trim(), url);
    let id = d.create(&[]);
    assert_eq!(d.sh(&id, "echo first").1, "first\n");
    // Another home is another daemon.
    let other = Daemon::start();
    assert_ne!(other.url, url);
    let id2 = other.create(&[]);
    assert_eq!(other.sh(&id2, "echo second").1, "second\n");
    assert_eq!(d.json(&["task", "list"]).as_array().unwrap().len(), 1);
}

#[test]
fn config_file_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("cairn.toml");
    std::fs::write(&good, "[defaults]\nmemory = \"1G\"\npids = 100\n").unwrap();
    let d = Daemon::start_with(&["--config", good.to_str().unwrap()]);
    let id = d.create(&[]);
    let t = d.task(&id);
    assert_eq!(t["limits"]["memory"], "1G");
    assert_eq!(t["limits"]["pids"], 100);
    assert_eq!(t["limits"]["disk"], "2G", "keys not in the file keep their defaults");
    // Through the layout the product detects: memory.limit_in_bytes on v1,
    // memory.max on v2.
    let layout = cairn_sandbox::inspect::CgroupLayout::detect().expect("the host's cgroup layout");
    let file = match layout.version() {
        cairn_sandbox::inspect::CgroupVersion::V1 => "memory.limit_in_bytes",
        _ => "memory.max",
    };
    let applied = std::fs::read_to_string(common::cgroup_file(&id, "memory", file)).expect("the task's memory cgroup");
    assert_eq!(applied.trim(), (1u64 << 30).to_string(), "the limit is really applied");
    // A flag on create still wins over the file.
    let small = d.create(&["--memory", "256M"]);
    assert_eq!(d.task(&small)["limits"]["memory"], "256M");

    for (body, key) in [("colour = \"blue\"\n", "colour"), ("[defaults]\nmemory = \"lots\"\n", "defaults.memory"), ("[defaults]\nram = \"1G\"\n", "ram")] {
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, body).unwrap();
        let home = tempfile::tempdir_in("/var/tmp").unwrap();
        let child = Command::new(common::CAIRN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config", bad.to_str().unwrap()])
            .env("CAIRN_HOME", home.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(child, Duration::from_secs(20), "cairn serve with a bad config");
        assert!(!out.status.success());
        let err = text(&out.stderr);
        let line = err.lines().find(|l| l.starts_with("cairn: ")).unwrap_or_else(|| panic!("no error line in {err:?}"));
        assert!(line.contains(key) && line.contains("bad.toml"), "{line}");
        assert!(!home.path().join("url").exists(), "a daemon with a bad config must not start");
    }
}

/// A small self-contained root: busybox if the host has it, else dash and
/// the libraries it needs. Either way /bin/sh runs and /etc/marker says
/// which tree it is.
fn build_rootfs(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("etc/marker"), "from-the-image\n").unwrap();
    let busybox = ["/usr/bin/busybox", "/bin/busybox"].into_iter().find(|p| Path::new(p).exists());
    if let Some(bb) = busybox {
        std::fs::copy(bb, dir.join("bin/busybox")).unwrap();
        for applet in ["sh", "cat", "ls", "echo"] {
            symlink("busybox", dir.join("bin").join(applet)).unwrap();
        }
        return;
    }
    std::fs::copy("/bin/dash", dir.join("bin/sh")).unwrap();
    let ldd = common::run(Command::new("ldd").arg("/bin/dash")).expect("ldd");
    for word in text(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
        let dest = dir.join(word.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(word, &dest).unwrap();
    }
}

fn image_names(d: &Daemon) -> Vec<String> {
    d.json(&["image", "list"]).as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn image_import_use_and_remove() {
    let d = Daemon::start();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("rootfs");
    build_rootfs(&root);
    let tgz = work.path().join("rootfs.tar.gz");
    let st = common::run(Command::new("tar").arg("czf").arg(&tgz).arg("-C").arg(&root).arg(".")).unwrap().status;
    assert!(st.success());
    assert_eq!(image_names(&d), ["host"]);

    let out = d.ok(&["image", "import", "tiny", root.to_str().unwrap()]);
    assert!(out.starts_with("imported tiny ("), "{out}");
    let v = d.json(&["image", "import", "tiny-tgz", tgz.to_str().unwrap()]);
    assert_eq!(v["name"], "tiny-tgz");
    assert_eq!(v["kind"], "rootfs");
    assert!(v["files"].as_u64().unwrap() >= 3);
    assert_eq!(image_names(&d), ["host", "tiny", "tiny-tgz"]);
    let table = d.ok(&["image", "list"]);
    assert!(table.lines().any(|l| l.starts_with("tiny ") && l.contains("rootfs")), "{table}");
    let err = d.fails(&["image", "import", "tiny", root.to_str().unwrap()]);
    assert!(err.contains("already exists"), "{err}");

    for image in ["tiny", "tiny-tgz"] {
        let id = d.create(&["--image", image]);
        assert_eq!(d.task(&id)["config"]["image"], image);
        let (code, out, err) = d.sh(&id, "read m < /etc/marker; echo \"$m\"");
        assert_eq!((code, out.as_str()), (0, "from-the-image\n"), "stderr {err}");
        let err = d.fails(&["image", "rm", image]);
        assert!(err.contains("used by") && err.contains(&id), "{err}");
        assert!(image_names(&d).contains(&image.to_owned()));
        let pid = pid_of(&d, &id);
        d.ok(&["destroy", &id]);
        assert_eq!(d.leftovers(&id, pid), Vec::<String>::new());
        assert_eq!(d.ok(&["image", "rm", image]).trim(), format!("removed image {image}"));
    }
    assert_eq!(image_names(&d), ["host"]);
    let err = d.fails(&["image", "rm", "host"]);
    assert!(err.contains("host") && err.contains("built in"), "{err}");
    let err = d.fails(&["task", "create", "--image", "tiny"]);
    assert!(err.contains("unknown image"), "{err}");
    assert_eq!(image_names(&d), ["host"]);
    // Nothing of the removed images is left in the store.
    let left: Vec<_> = std::fs::read_dir(d.home().join("images")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, ["host"], "{left:?}");
    let mut buf = String::new();
    let _ = std::fs::File::open(root.join("etc/marker")).unwrap().read_to_string(&mut buf);
    assert_eq!(buf, "from-the-image\n", "the source is left as it was");
}
