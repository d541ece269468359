//! Commands over plain HTTP (`POST /v1/tasks/{id}/exec`), without the
//! WebSocket: the collected answer, stdin, environment, working directory,
//! timeouts, the output cap, the server-sent-events variant, and bad input.
//! Driven with `curl` against a real daemon and sandbox.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::Daemon;
use serde_json::{json, Value};

/// POSTs `body` to the task's exec route; returns (status, body).
fn post(d: &Daemon, task: &str, body: &Value, stream: bool) -> (u16, String) {
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-N", "-o", "-", "-w", "\n%{http_code}", "-X", "POST"])
        .args(["-H", &format!("authorization: Bearer {}", token.trim()), "-H", "content-type: application/json"])
        .args(["--data-binary", &body.to_string()]);
    if stream {
        cmd.args(["-H", "accept: text/event-stream"]);
    }
    cmd.arg(format!("{}/v1/tasks/{task}/exec", d.url));
    let out = common::output_within(&mut cmd, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

fn run(d: &Daemon, task: &str, body: Value) -> Value {
    let (code, text) = post(d, task, &body, false);
    assert_eq!(code, 200, "{body} answered {code}: {text}");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_command_runs_to_its_end_and_answers_its_output_and_exit() {
    common::require_root();
    let d = Daemon::start();
    let t = d.create(&[]);

    let a = run(&d, &t, json!({"cmd": ["sh", "-c", "echo out; echo err >&2; exit 3"]}));
    assert_eq!((a["exit_code"].as_i64(), a["stdout"].as_str(), a["stderr"].as_str()), (Some(3), Some("out\n"), Some("err\n")));
    assert_eq!((a["signal"].clone(), a["oom_killed"].as_bool(), a["truncated"].as_bool()), (Value::Null, Some(false), Some(false)));
    assert!(a["duration_ms"].as_u64().is_some());

    // stdin, environment and working directory.
    let a = run(&d, &t, json!({"cmd": ["sh", "-c", "cat; echo \" $GREETING $(pwd)\""], "stdin": "hello", "env": {"GREETING": "hi"}, "cwd": "/tmp"}));
    assert_eq!(a["stdout"], "hello hi /tmp\n");
    // Without stdin the command reads nothing (and does not hang).
    assert_eq!(run(&d, &t, json!({"cmd": ["cat"]}))["exit_code"], 0);
    // It ran in the task: what it wrote stays for the next command.
    run(&d, &t, json!({"cmd": ["sh", "-c", "echo kept > /workspace/f"]}));
    assert_eq!(run(&d, &t, json!({"cmd": ["cat", "/workspace/f"]}))["stdout"], "kept\n");

    // A timeout kills it, with timeout(1)'s code.
    let a = run(&d, &t, json!({"cmd": ["sleep", "30"], "timeout": 0.5}));
    assert_eq!((a["exit_code"].as_i64(), a["timed_out"].as_bool()), (Some(124), Some(true)));

    // Output past the cap is cut and says so; the command still ran to its end.
    let a = run(&d, &t, json!({"cmd": ["sh", "-c", "head -c 1200000 /dev/zero | tr '\\0' x; echo done >&2"]}));
    assert_eq!(a["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!((a["truncated"].as_bool(), a["stderr"].as_str()), (Some(true), Some("done\n")));

    // Each run is in the task's log, as a WebSocket exec is.
    let log = d.json(&["log", &t]);
    let execs = log.as_array().unwrap().iter().filter(|e| e["kind"] == "exec").count();
    assert!(execs >= 7, "{execs} exec events");
}

#[test]
fn a_streamed_command_sends_its_output_as_it_comes_then_its_exit() {
    common::require_root();
    let d = Daemon::start();
    let t = d.create(&[]);
    let (code, text) = post(&d, &t, &json!({"cmd": ["sh", "-c", "echo one; sleep 0.3; echo two >&2; exit 5"]}), true);
    assert_eq!(code, 200, "{text}");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter_map(|block| {
            let name = block.lines().find_map(|l| l.strip_prefix("event:"))?.trim().to_owned();
            let data = block.lines().find_map(|l| l.strip_prefix("data:"))?.trim();
            Some((name, serde_json::from_str(data).unwrap()))
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["stdout", "stderr", "exit"], "{text}");
    assert_eq!(events[0].1["data"], "one\n");
    assert_eq!(events[1].1["data"], "two\n");
    assert_eq!(events[2].1["exit_code"], 5);
}

#[test]
fn bad_runs_are_refused_with_one_line_naming_what_was_wrong() {
    common::require_root();
    let d = Daemon::start();
    let t = d.create(&[]);
    let cases = [
        // No command, and the host image has no Entrypoint or Cmd to run.
        (json!({"cmd": []}), 400, "no command given"),
        (json!({}), 400, "no command given"),
        (json!({"cmd": ["true"], "user": "a:b:c"}), 400, "invalid user"),
        (json!({"cmd": ["true"], "timeout": -1}), 400, "timeout must be"),
        (json!({"cmd": ["true"], "env": {"A=B": "c"}}), 400, "not a variable name"),
        (json!({"cmd": ["true"], "argv": ["x"]}), 400, "unknown field"),
        (json!({"cmd": ["true"], "cwd": "relative"}), 400, "working directory"),
    ];
    for (body, status, says) in cases {
        let (code, text) = post(&d, &t, &body, false);
        assert_eq!(code, status, "{body}: {text}");
        let err: Value = serde_json::from_str(&text).unwrap();
        let message = err["error"]["message"].as_str().unwrap();
        assert_eq!(err["error"]["code"], "invalid");
        assert!(message.contains(says) && !message.contains('\n'), "{body}: {message}");
    }
    // An unknown task is 404, also when streaming (before the stream starts).
    for stream in [false, true] {
        let (code, text) = post(&d, "t0000000000x", &json!({"cmd": ["true"]}), stream);
        assert_eq!(code, 404, "{text}");
    }
    // Positive control: the same task runs a good command.
    assert_eq!(run(&d, &t, json!({"cmd": ["true"]}))["exit_code"], 0);
}

fn file(d: &Daemon, task: &str, method: &str, path: &str, data: Option<&[u8]>) -> (u16, Vec<u8>) {
    d.http_file(task, method, path, data)
}

#[test]
fn single_files_go_in_and_out_as_raw_bytes_and_links_out_are_refused() {
    common::require_root();
    let d = Daemon::start();
    let t = d.create(&[]);
    let bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let (code, answer) = file(&d, &t, "PUT", "/workspace/data.bin", Some(&bytes));
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&answer));
    assert_eq!(d.sh(&t, "stat -c '%s %u %a' /workspace/data.bin").1, "300000 0 644\n", "written whole, owned by the sandbox's root");
    assert_eq!(file(&d, &t, "GET", "/workspace/data.bin", None), (200, bytes.clone()));
    // Replacing a file.
    assert_eq!(file(&d, &t, "PUT", "/workspace/data.bin", Some(b"short")).0, 200);
    assert_eq!(file(&d, &t, "GET", "/workspace/data.bin", None), (200, b"short".to_vec()));

    // Missing directories on the way are made, as mkdir -p would, owned
    // by the sandbox's root.
    assert_eq!(file(&d, &t, "PUT", "/workspace/new/deeper/f.txt", Some(b"nested")).0, 200);
    assert_eq!(d.sh(&t, "cat /workspace/new/deeper/f.txt; stat -c ' %u %a' /workspace/new/deeper").1, "nested 0 755\n");

    // A link the agent planted to a host file is refused, not followed,
    // both ways (the positive control is the file above).
    d.sh(&t, "ln -s /etc/hostname /workspace/link; mkdir /workspace/dir");
    let (code, text) = file(&d, &t, "GET", "/workspace/link", None);
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&text));
    assert!(String::from_utf8_lossy(&text).contains("is a symlink, which is not followed"), "the refusal names the link: {}", String::from_utf8_lossy(&text));
    let (code, text) = file(&d, &t, "PUT", "/workspace/link", Some(b"owned"));
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&text));
    assert_eq!(d.sh(&t, "readlink /workspace/link").1, "/etc/hostname\n", "the link is untouched");

    // Bad input: one line naming what was wrong.
    for (method, path, data, status) in [
        ("GET", "/workspace/missing", None, 404),
        ("GET", "/workspace/dir", None, 400),
        ("PUT", "/workspace/dir", Some(b"x".as_slice()), 400),
        ("PUT", "/workspace/data.bin/f", Some(b"x".as_slice()), 400),
        ("GET", "../../etc/passwd", None, 400),
    ] {
        let (code, text) = file(&d, &t, method, path, data);
        let text = String::from_utf8_lossy(&text).into_owned();
        assert_eq!(code, status, "{method} {path}: {text}");
        let err: Value = serde_json::from_str(&text).unwrap();
        assert!(!err["error"]["message"].as_str().unwrap().contains('\n'), "{text}");
    }
}

#[test]
fn a_directory_lists_its_entries_without_following_links_out() {
    common::require_root();
    let d = Daemon::start();
    let t = d.create(&[]);
    d.sh(&t, "mkdir -p /workspace/l/sub && printf abc > /workspace/l/a.txt && chmod 640 /workspace/l/a.txt && ln -s /etc /workspace/l/out && ln -s /workspace/l /workspace/via");
    let (code, body) = d.http_dir(&t, "/workspace/l");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["path"], "/workspace/l");
    assert_eq!(v["truncated"], false);
    let names: Vec<&str> = v["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a.txt", "out", "sub"], "sorted by name");
    let a = &v["entries"][0];
    assert_eq!((a["kind"].as_str(), a["size"].as_u64(), a["mode"].as_u64()), (Some("file"), Some(3), Some(0o640)));
    let link = &v["entries"][1];
    assert_eq!((link["kind"].as_str(), link["target"].as_str()), (Some("symlink"), Some("/etc")), "a link is listed, not followed");
    assert_eq!(v["entries"][2]["kind"], "dir");

    // A link on the way is followed inside the sandbox: /workspace/via is
    // /workspace/l, never the host's directory of the same name.
    let (code, body) = d.http_dir(&t, "/workspace/via");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["path"], "/workspace/l");
    // /workspace/l/out is the sandbox's /etc (its own hostname file), not the host's.
    let (code, body) = d.http_dir(&t, "/workspace/l/out");
    assert_eq!(code, 200);
    let sandbox_etc: Vec<String> = serde_json::from_slice::<Value>(&body).unwrap()["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_owned()).collect();
    let listed_in_sandbox = d.sh(&t, "ls -A /etc | LC_ALL=C sort").1;
    assert_eq!(sandbox_etc.join("\n") + "\n", listed_in_sandbox);

    // Bad input: one line naming what was wrong.
    for (path, status) in [("/workspace/missing", 404), ("/workspace/l/a.txt", 400), ("../../etc", 400)] {
        let (code, text) = d.http_dir(&t, path);
        let text = String::from_utf8_lossy(&text).into_owned();
        assert_eq!(code, status, "{path}: {text}");
        let err: Value = serde_json::from_str(&text).unwrap();
        let message = err["error"]["message"].as_str().unwrap();
        assert!(!message.contains('\n') && (message.contains("sandbox path") || message.contains(path)), "{path}: {message}");
    }
}

/// A name that is not UTF-8 (Latin-1 `café`) is listed losslessly (shown
/// `caf\xe9`, its bytes in `name_b64`), read and written back by its bytes
/// percent-encoded, and shown the same way in a snapshot diff; the
/// replacement character names nothing.
#[test]
fn a_name_that_is_not_utf8_is_listed_losslessly_and_read_back_by_its_bytes() {
    common::require_root();
    let d = Daemon::start();
    let t = d.create(&[]);
    let before = d.json(&["snapshot", &t])["id"].as_str().unwrap().to_owned();
    d.sh(&t, r"mkdir -p /workspace/n && printf latin1 > /workspace/n/caf$(printf '\351') && printf plain > /workspace/n/plain");
    let (code, body) = d.http_dir(&t, "/workspace/n");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let listing: Value = serde_json::from_slice(&body).unwrap();
    let entries = listing["entries"].as_array().unwrap();
    let latin1 = entries.iter().find(|e| e["name"] == r"caf\xe9").unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(latin1["name_b64"], "Y2Fm6Q==", "{listing}");
    let plain = entries.iter().find(|e| e["name"] == "plain").unwrap();
    assert!(plain.get("name_b64").is_none(), "a UTF-8 name has no bytes beside it: {plain}");
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let raw = |method: &str, query: &str, data: Option<&str>| {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-w", "\n%{http_code}", "-X", method, "-H", &format!("authorization: Bearer {}", token.trim())]);
        if let Some(data) = data {
            cmd.args(["--data-binary", data]);
        }
        let out = common::output_within(cmd.arg(format!("{}/v1/tasks/{t}/file?path={query}", d.url)), Duration::from_secs(30));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    assert_eq!(raw("GET", "/workspace/n/caf%E9", None), ("200".to_owned(), "latin1".to_owned()));
    let (code, answer) = raw("PUT", "/workspace/n/caf%E9.copy", Some("again"));
    assert_eq!(code, "200", "{answer}");
    assert_eq!(serde_json::from_str::<Value>(&answer).unwrap()["path"], r"/workspace/n/caf\xe9.copy");
    assert_eq!(d.sh(&t, r"cat /workspace/n/caf$(printf '\351').copy").1, "again");
    // U+FFFD, as a lossy client would send it, names nothing.
    assert_eq!(raw("GET", "/workspace/n/caf%EF%BF%BD", None).0, "404");
    // A snapshot diff shows the name escaped, and its file diff reads it.
    let after = d.json(&["snapshot", &t])["id"].as_str().unwrap().to_owned();
    let diff = d.json(&["snapshot", "diff", &t, &before, &after]);
    let added: Vec<&str> = diff["added"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(added.contains(&r"/workspace/n/caf\xe9") && !added.iter().any(|p| p.contains('\u{fffd}')), "{diff}");
}
