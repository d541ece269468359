//! The web console (`cairn-console`): its login and sessions, what every
//! route refuses without one, CSRF, the escaping of everything a task
//! can write, the security headers, the HTTP layer's JSON errors, and the
//! whole tour in headless Chromium (`console_driver.py`).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::Value;

/// One HTTP exchange: status, headers (names lowercased), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `curl` against the daemon, following no redirect; `args` go before the URL.
fn http(d: &Daemon, method: &str, path: &str, args: &[&str]) -> Answer {
    let dir = tempfile::tempdir().unwrap();
    let (head, body) = (dir.path().join("head"), dir.path().join("body"));
    let out = common::output_within(
        Command::new("curl")
            .args(["-s", "--max-time", "20", "-X", method, "-D", head.to_str().unwrap(), "-o", body.to_str().unwrap(), "-w", "%{http_code}"])
            .args(args)
            .arg(format!("{}{path}", d.url)),
        Duration::from_secs(30),
    );
    let headers = std::fs::read_to_string(&head)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status: String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0),
        headers,
        body: std::fs::read_to_string(&body).unwrap_or_default(),
    }
}

fn token(d: &Daemon) -> String {
    std::fs::read_to_string(d.home().join("token")).unwrap().trim().to_owned()
}

/// Logs in; the session cookie (`cairn_session=...`).
fn log_in(d: &Daemon) -> String {
    let a = http(d, "POST", "/console/login", &["--data-urlencode", &format!("token={}", token(d))]);
    assert_eq!(a.status, 303, "{}", a.body);
    let set = a.header("set-cookie").unwrap().to_owned();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"), "{set}");
    set.split(';').next().unwrap().to_owned()
}

fn get(d: &Daemon, cookie: &str, path: &str) -> Answer {
    http(d, "GET", path, &["-H", &format!("cookie: {cookie}")])
}

/// The csrf token of the session's forms, read off a page.
fn csrf(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a form with a csrf field") + "name=\"csrf\" value=\"".len();
    page[at..].split('"').next().unwrap().to_owned()
}

#[test]
fn every_console_route_is_refused_without_a_session() {
    let d = Daemon::start();
    let id = d.create(&["--name", "guarded"]);
    let pages = ["/", "/?state=running", "/console/approvals", "/console/system", &format!("/console/tasks/{id}"), &format!("/console/tasks/{id}/ledger")];
    for p in pages {
        let a = http(&d, "GET", p, &[]);
        assert_eq!(a.status, 303, "GET {p} without a session: {}", a.body);
        assert!(a.header("location").unwrap().starts_with("/console/login?next="), "GET {p}: {:?}", a.headers);
        assert!(!a.body.contains(&id), "GET {p} shows nothing of the task");
    }
    for stream in ["live", "output"] {
        let live = http(&d, "GET", &format!("/console/tasks/{id}/{stream}"), &[]);
        assert_eq!(live.status, 401, "{stream}: {}", live.body);
        let err: Value = serde_json::from_str(&live.body).unwrap();
        assert_eq!(err["error"]["code"], "unauthorized", "{err}");
    }
    for p in [format!("/console/approvals/{id}"), "/console/logout".to_owned()] {
        let a = http(&d, "POST", &p, &["--data", "csrf=x&decision=approve"]);
        assert_eq!(a.status, 401, "POST {p} without a session: {}", a.body);
    }
    // The bearer token is the API's, not a console session.
    let bearer = http(&d, "GET", "/", &["-H", &format!("authorization: Bearer {}", token(&d))]);
    assert_eq!(bearer.status, 303);

    // Positive control: with a session, each page is served.
    let cookie = log_in(&d);
    for p in pages {
        let a = get(&d, &cookie, p);
        assert_eq!(a.status, 200, "GET {p} with a session: {}", a.body);
    }
    assert!(get(&d, &cookie, "/").body.contains("guarded"));
}

#[test]
fn forged_and_replayed_cookies_are_refused() {
    let d = Daemon::start();
    let wrong = http(&d, "POST", "/console/login", &["--data", "token=not-the-token"]);
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none(), "no session for a wrong token");
    assert!(wrong.body.contains("not the daemon&#39;s API token") || wrong.body.contains("not the daemon's API token"), "{}", wrong.body);

    let cookie = log_in(&d);
    assert_eq!(get(&d, &cookie, "/").status, 200, "the session works");
    let forged = format!("cairn_session={}", "a".repeat(64));
    assert_eq!(get(&d, &forged, "/").status, 303, "a forged cookie");
    let flipped = {
        let (name, value) = cookie.split_once('=').unwrap();
        let first = if value.starts_with('0') { '1' } else { '0' };
        format!("{name}={first}{}", &value[1..])
    };
    assert_eq!(get(&d, &flipped, "/").status, 303, "a cookie one character off");

    // Log out with the session's csrf token; the same cookie is then dead.
    let page = get(&d, &cookie, "/").body;
    let out = http(&d, "POST", "/console/logout", &["-H", &format!("cookie: {cookie}"), "--data", &format!("csrf={}", csrf(&page))]);
    assert_eq!(out.status, 303, "{}", out.body);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"), "{:?}", out.headers);
    assert_eq!(get(&d, &cookie, "/").status, 303, "a replayed cookie after logout");
    // Another session is untouched by that logout.
    let other = log_in(&d);
    assert_eq!(get(&d, &other, "/").status, 200);
}

#[test]
fn forms_need_the_sessions_csrf_token_and_the_same_site() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let w = d.json(&["wait", &id, "--approval", "Ship it?"]);
    assert_eq!(w["state"], "pending", "{w}");
    let cookie = log_in(&d);
    let other = log_in(&d);
    let page = get(&d, &cookie, "/console/approvals").body;
    assert!(page.contains(&format!("id=\"approval-{id}\"")), "{page}");
    let token = csrf(&page);
    let other_token = csrf(&get(&d, &other, "/console/approvals").body);
    assert_ne!(token, other_token);
    let post = |extra: &[&str], form: &str| {
        let c = format!("cookie: {cookie}");
        let mut args = vec!["-H", c.as_str(), "--data", form];
        args.extend_from_slice(extra);
        http(&d, "POST", &format!("/console/approvals/{id}"), &args)
    };
    let missing = post(&[], "decision=approve");
    assert_eq!(missing.status, 422, "{}", missing.body);
    let err: Value = serde_json::from_str(&missing.body).expect("the HTTP layer's error in the API's JSON body");
    assert_eq!(err["error"]["code"], "invalid", "{err}");
    let foreign = post(&[], &format!("csrf={other_token}&decision=approve"));
    assert_eq!(foreign.status, 403, "another session's token: {}", foreign.body);
    let cross = post(&["-H", "origin: https://attacker.example.com"], &format!("csrf={token}&decision=approve"));
    assert_eq!(cross.status, 403, "a cross-site post: {}", cross.body);
    let fetch_site = post(&["-H", "sec-fetch-site: cross-site"], &format!("csrf={token}&decision=approve"));
    assert_eq!(fetch_site.status, 403, "{}", fetch_site.body);
    assert_eq!(d.json(&["task", "show", &id])["pending_wait"]["state"], "pending", "nothing was decided");

    // Positive control: the same form from the same site with its token.
    let origin = format!("origin: {}", d.url);
    let ok = post(&["-H", &origin], &format!("csrf={token}&decision=approve&note=fine"));
    assert_eq!(ok.status, 303, "{}", ok.body);
    assert_eq!(ok.header("location"), Some(format!("/console/tasks/{id}").as_str()));
    d.wait_for_state(&id, "running", Duration::from_secs(20));
    let inbox = d.json(&["log", &id]);
    assert!(inbox.as_array().unwrap().iter().any(|e| e["kind"] == "event_received"), "{inbox}");
}

/// The server-sent events in `text`: (name, data as JSON).
fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|frame| {
            let name = frame.lines().find_map(|l| l.strip_prefix("event:"))?.trim().to_owned();
            let data = frame.lines().find_map(|l| l.strip_prefix("data:"))?.trim();
            Some((name, serde_json::from_str(data).ok()?))
        })
        .collect()
}

#[test]
fn a_running_commands_output_appears_as_it_comes() {
    let d = Daemon::start();
    let id = d.create(&["--name", "chatty"]);
    let cookie = log_in(&d);
    let page = get(&d, &cookie, &format!("/console/tasks/{id}"));
    assert!(page.body.contains(&format!("data-live=\"/console/tasks/{id}/output\"")), "{}", page.body);
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("output.sse");
    let watcher = Command::new("curl")
        .args(["-sN", "--max-time", "30", "-H", &format!("cookie: {cookie}"), "-o", stream.to_str().unwrap()])
        .arg(format!("{}/console/tasks/{id}/output", d.url))
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut cmd = d.cmd();
    cmd.args(["exec", &id, "--", "sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo line-$i; echo '<b>warn</b>' >&2; sleep 0.5; done"]);
    let mut running = cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    // Output is there while the command still runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let events = sse_events(&std::fs::read_to_string(&stream).unwrap_or_default());
        let lines: Vec<&Value> = events.iter().filter(|(n, v)| n == "output" && v["stream"] == "stdout").map(|(_, v)| v).collect();
        if lines.len() >= 2 {
            assert!(running.try_wait().unwrap().is_none(), "the command was still running when its output arrived");
            assert!(lines.iter().all(|v| v["text"].as_str().unwrap().starts_with("line-") && v["step"].as_u64() > Some(0)), "{lines:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no output while the command ran: {events:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = common::output_of(running, Duration::from_secs(30)).unwrap();
    assert!(done.status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events = sse_events(&std::fs::read_to_string(&stream).unwrap_or_default());
        if events.iter().any(|(n, _)| n == "exited") {
            break events;
        }
        assert!(std::time::Instant::now() < deadline, "no end of the command: {events:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let exited = events.iter().find(|(n, _)| n == "exited").unwrap();
    assert_eq!(exited.1["exit_code"], 0);
    let stderr: String = events.iter().filter(|(n, v)| n == "output" && v["stream"] == "stderr").map(|(_, v)| v["text"].as_str().unwrap().to_owned()).collect();
    assert!(stderr.contains("<b>warn</b>"), "stderr as the command wrote it (the page writes it as text): {stderr}");
    let out: String = events.iter().filter(|(n, v)| n == "output" && v["stream"] == "stdout").map(|(_, v)| v["text"].as_str().unwrap().to_owned()).collect();
    assert!(out.ends_with("line-8\n"), "{out}");
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    unsafe { libc::kill(watcher.id() as i32, libc::SIGTERM) };
    let _ = common::output_of(watcher, Duration::from_secs(10));
    d.ok(&["destroy", &id]);
}

#[test]
fn what_a_task_writes_is_shown_as_text() {
    let d = Daemon::start();
    let xss = [
        "<script>alert(1)</script>",
        "\"><img src=x onerror=alert(2)>",
        "javascript:alert(3)//<svg onload=alert(4)>",
        "</textarea><iframe srcdoc='<script>alert(5)</script>'>",
    ];
    let id = d.create(&["--name", "xss", "--metadata", &format!("owner={}", xss[1])]);
    for (i, s) in xss.iter().enumerate() {
        let (code, _, err) = d.sh(&id, &format!("printf '%s' '{}' > /workspace/f{i}; echo '{}'", s.replace('\'', "'\\''"), s.replace('\'', "'\\''")));
        assert_eq!(code, 0, "{err}");
    }
    d.ok(&["snapshot", &id, "--kind", "milestone", "--note", xss[0]]);
    d.sh(&id, "echo more > /workspace/after");
    let w = d.json(&["wait", &id, "--approval", xss[3]]);
    assert_eq!(w["state"], "pending", "{w}");
    let cookie = log_in(&d);
    let link = w["approval_url"].as_str().unwrap().strip_prefix(&d.url).unwrap().to_owned();
    let pages = [
        "/".to_owned(),
        format!("/?meta=owner%3D{}", common_query(xss[1])),
        format!("/console/tasks/{id}"),
        "/console/approvals".to_owned(),
        link.clone(),
    ];
    for p in &pages {
        let a = get(&d, &cookie, p);
        assert_eq!(a.status, 200, "{p}: {}", a.body);
        let own_scripts = if p.starts_with("/approve/") { 0 } else { 1 };
        for s in xss {
            for raw in ["<script>alert", "<img", "<svg", "<iframe", "</textarea><iframe"] {
                if s.contains(raw) {
                    assert!(!a.body.contains(raw), "{p} carries {raw:?} unescaped:\n{}", a.body);
                }
            }
        }
        assert_eq!(a.body.matches("<script").count(), own_scripts, "{p}: only the console's own script");
    }
    // The approval page shows the same context as the console, escaped.
    let page = get(&d, &cookie, &link).body;
    assert!(page.contains("Changed since milestone") && page.contains("<code>/workspace/after</code>"), "{page}");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the milestone's note, escaped: {page}");
    assert!(page.contains("Last commands") && page.contains("<code>$ sh -c echo more &gt; /workspace/after</code>"), "{page}");
    let timeline = get(&d, &cookie, &format!("/console/tasks/{id}")).body;
    assert!(timeline.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the note is shown, escaped");
    let approvals = get(&d, &cookie, "/console/approvals").body;
    assert!(approvals.contains("&lt;/textarea&gt;&lt;iframe"), "the prompt is shown, escaped");
    assert!(approvals.contains("Changed since milestone"), "{approvals}");
    assert!(approvals.contains("<code>/workspace/after</code>") || approvals.contains("<code>workspace/after</code>"), "{approvals}");
    let filtered = get(&d, &cookie, &pages[1]).body;
    assert!(filtered.contains("xss"), "the label filter finds the task: {filtered}");
}

/// Percent-encodes a query value.
fn common_query(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

#[test]
fn pages_carry_the_security_headers_and_the_approval_page_too() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let w = d.json(&["wait", &id, "--approval", "Go?"]);
    let link = w["approval_url"].as_str().unwrap().strip_prefix(&d.url).unwrap().to_owned();
    let cookie = log_in(&d);
    let answers = [
        ("login", http(&d, "GET", "/console/login", &[])),
        ("tasks", get(&d, &cookie, "/")),
        ("timeline", get(&d, &cookie, &format!("/console/tasks/{id}"))),
        ("approvals", get(&d, &cookie, "/console/approvals")),
        ("system", get(&d, &cookie, "/console/system")),
        ("approval page", http(&d, "GET", &link, &[])),
    ];
    for (what, a) in &answers {
        assert_eq!(a.status, 200, "{what}: {}", a.body);
        let csp = a.header("content-security-policy").unwrap_or_else(|| panic!("{what} has no CSP: {:?}", a.headers));
        assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
        let script = csp.split(';').map(str::trim).find(|d| d.starts_with("script-src")).unwrap_or("script-src (default-src 'none')");
        assert!(!script.contains("unsafe-inline"), "{what}: {csp}");
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"), "{what}");
        assert_eq!(a.header("x-frame-options"), Some("DENY"), "{what}");
        assert!(a.header("content-type").unwrap().starts_with("text/html"), "{what}");
    }
    let js = http(&d, "GET", "/console/assets/console.js", &[]);
    assert_eq!((js.status, js.header("content-type")), (200, Some("text/javascript; charset=utf-8")));
    assert!(js.body.contains("EventSource"));
    assert_eq!(http(&d, "GET", "/console/assets/..%2Ftoken", &[]).status, 404);
}

#[test]
fn the_http_layers_own_errors_answer_in_json() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let bearer = format!("authorization: Bearer {}", token(&d));
    let bad_query = http(&d, "GET", "/v1/waits/wnone?block_ms=soon", &["-H", &bearer]);
    let big = d.home().join("big.json");
    std::fs::write(&big, vec![b' '; 300 * 1024]).unwrap();
    let too_large = http(&d, "POST", &format!("/v1/hooks/{id}/big"), &["--data-binary", &format!("@{}", big.display())]);
    let cookie = log_in(&d);
    let bad_form = http(&d, "POST", "/console/logout", &["-H", &format!("cookie: {cookie}"), "--data", "nothing=1"]);
    for (what, a, status, code) in [("query", bad_query, 400, "invalid"), ("body size", too_large, 413, "too_large"), ("form", bad_form, 422, "invalid")] {
        assert_eq!(a.status, status, "{what}: {}", a.body);
        assert_eq!(a.header("content-type"), Some("application/json"), "{what}");
        let v: Value = serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", a.body));
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{what}: {v}");
    }
    // The console's own bad input: a page number too big, or not one, a state that is none.
    let huge = get(&d, &cookie, "/?page=18446744073709551615");
    assert_eq!(huge.status, 200, "a page past the end is an empty page: {}", huge.body);
    assert!(huge.body.contains("No task matches."));
    let nan = get(&d, &cookie, "/?page=first");
    assert_eq!(nan.status, 400, "{}", nan.body);
    assert_eq!(serde_json::from_str::<Value>(&nan.body).unwrap()["error"]["code"], "invalid");
    let state = get(&d, &cookie, "/?state=asleep");
    assert_eq!(state.status, 400);
    assert!(state.body.contains("no task state &quot;asleep&quot;: the states are created, running"), "{}", state.body);
    // A handler's own error keeps its body (positive control of the mapping).
    let missing = http(&d, "GET", "/v1/tasks/tnope", &["-H", &bearer]);
    assert_eq!(missing.status, 404);
    assert_eq!(serde_json::from_str::<Value>(&missing.body).unwrap()["error"]["code"], "not_found");
}

#[test]
fn the_timeline_pages_through_a_long_log_and_verifies_the_ledger_apart() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let bearer = format!("authorization: Bearer {}", token(&d));
    for i in 0..210 {
        let a = http(&d, "POST", &format!("/v1/tasks/{id}/exec"), &["-H", &bearer, "-H", "content-type: application/json", "--data", &format!(r#"{{"cmd":["echo","n{i}"]}}"#)]);
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let total = d.json(&["log", &id]).as_array().unwrap().len();
    assert!(total > 210, "{total}");
    let cookie = log_in(&d);
    let newest = get(&d, &cookie, &format!("/console/tasks/{id}")).body;
    let rows = |page: &str| page.matches("<li class=\"ev ").count();
    assert_eq!(rows(&newest), 200, "a page of 200 events");
    assert!(newest.contains(&format!("id=\"ev-{total}\"")), "the newest event is on the first page");
    assert!(!newest.contains("id=\"ev-1\""), "the oldest is not");
    let first_shown = total - 199;
    let older_link = format!("/console/tasks/{id}?before={first_shown}");
    assert!(newest.contains(&older_link), "a link to the older events");
    assert!(newest.contains(&format!("data-live=\"/console/tasks/{id}/live?after={total}\"")), "live from the newest");
    let older = get(&d, &cookie, &older_link).body;
    assert_eq!(rows(&older), first_shown - 1, "the rest");
    assert!(older.contains("id=\"ev-1\"") && !older.contains(&format!("id=\"ev-{first_shown}\"")));
    assert!(!older.contains("data-live"), "an older page is not live");
    assert!(!older.contains("?before="), "nothing older than the first event");

    // The ledger's verdict, apart from the page (it walks the whole chain).
    assert!(newest.contains(&format!("data-src=\"/console/tasks/{id}/ledger?part=verdict\"")));
    let verdict = get(&d, &cookie, &format!("/console/tasks/{id}/ledger?part=verdict"));
    assert_eq!(verdict.status, 200);
    assert!(verdict.body.contains(&format!("verified: {total} entries")), "{}", verdict.body);
    let page = get(&d, &cookie, &format!("/console/tasks/{id}/ledger")).body;
    assert!(page.contains("verified: ") && page.contains("<h1>Ledger of"), "{page}");
    assert_eq!(get(&d, &cookie, "/console/tasks/tnonexistent/ledger").status, 404);
    assert_eq!(get(&d, &cookie, "/console/tasks/tnonexistent").status, 404);
}

#[test]
fn a_snapshot_diff_shows_the_tree_text_diffs_and_binary_files_by_hash() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let (code, _, err) = d.sh(&id, "mkdir -p /workspace/src && printf 'one\\ntwo\\nthree\\n' > /workspace/src/a.txt && echo gone > /workspace/old.txt");
    assert_eq!(code, 0, "{err}");
    let a = d.json(&["snapshot", &id, "--kind", "milestone", "--note", "before"])["id"].as_str().unwrap().to_owned();
    let (code, _, err) = d.sh(
        &id,
        "printf 'one\\n2\\nthree\\n' > /workspace/src/a.txt && rm /workspace/old.txt && printf 'bin\\000ary' > '/workspace/<i>x.bin' \
         && head -c 2097152 /dev/zero | tr '\\0' x > /workspace/big.txt && printf latin1 > /workspace/caf$(printf '\\351')",
    );
    assert_eq!(code, 0, "{err}");
    let b = d.json(&["snapshot", &id, "--note", "after"])["id"].as_str().unwrap().to_owned();
    let cookie = log_in(&d);

    let list = get(&d, &cookie, &format!("/console/tasks/{id}/snapshots"));
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains(&format!("/console/tasks/{id}/diff?a={a}&amp;b={b}")), "a link to what changed since the one before: {}", list.body);

    let tree = get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b={b}"));
    assert_eq!(tree.status, 200, "{}", tree.body);
    let t = &tree.body;
    assert!(t.contains("<span class=\"dir\">workspace/</span>") && t.contains("<span class=\"dir\">src/</span>"), "a tree: {t}");
    for (change, name) in [("changed", "a.txt"), ("deleted", "old.txt"), ("added", "&lt;i&gt;x.bin"), ("added", "big.txt")] {
        assert!(t.contains(&format!("<span class=\"change {change}\">{change}</span>")) && t.contains(&format!(">{name}</a>")), "{change} {name}: {t}");
    }
    assert!(!t.contains("<i>"), "names escaped: {t}");

    let text = get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b={b}&path=/workspace/src/a.txt")).body;
    assert!(text.contains("<span class=\"del\">-two</span>") && text.contains("<span class=\"add\">+2</span>"), "a unified diff: {text}");
    let binary = get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b={b}&path=/workspace/%3Ci%3Ex.bin")).body;
    assert!(binary.contains("Binary, or too large"), "{binary}");
    let hash = blake3_hex(b"bin\0ary");
    assert!(binary.contains(&hash), "the binary file's BLAKE3: {binary}");
    let big = get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b={b}&path=/workspace/big.txt")).body;
    assert!(big.contains("2097152 B") && big.contains("not read (over the read limit)"), "a large file by its size, unread: {big}");
    // A name that is not UTF-8 is shown with its bytes escaped, never as
    // U+FFFD, and its link opens its change.
    assert!(t.contains(">caf\\xe9</a>") && !t.contains('\u{fffd}'), "{t}");
    let latin1 = get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b={b}&path=/workspace/caf%5Cxe9")).body;
    assert!(latin1.contains("<span class=\"add\">+latin1</span>"), "{latin1}");
    let deleted = get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b={b}&path=/workspace/old.txt")).body;
    assert!(deleted.contains("<span class=\"del\">-gone</span>"), "{deleted}");

    let missing = get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b={b}&path=/workspace/none"));
    assert_eq!(missing.status, 404, "{}", missing.body);
    assert_eq!(get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}&b=snope")).status, 404);
    assert_eq!(get(&d, &cookie, &format!("/console/tasks/{id}/diff?a={a}")).status, 400, "b is missing");
}

/// BLAKE3 of `data`, in hex (a blob id is the BLAKE3 of its bytes).
fn blake3_hex(data: &[u8]) -> String {
    cairn_blob::ObjectId::of(data).to_string()
}

#[test]
fn a_delivery_shows_its_record_verified_and_a_tampered_deliverable_is_named() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let (code, _, err) = d.sh(&id, "echo 'the report <b>' > /workspace/report.md && echo data > /workspace/out.txt");
    assert_eq!(code, 0, "{err}");
    let v = d.json(&["deliver", &id, "--report", "/workspace/report.md", "--file", "/workspace/out.txt"]);
    let record = v["record_id"].as_str().unwrap().to_owned();
    let cookie = log_in(&d);

    let timeline = get(&d, &cookie, &format!("/console/tasks/{id}")).body;
    assert!(timeline.contains(&format!("href=\"/console/deliveries/{record}\"")), "the delivery links its record: {timeline}");
    let page = get(&d, &cookie, &format!("/console/deliveries/{record}"));
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("<span class=\"ok\">verified</span>"), "{}", page.body);
    let digests: Vec<(String, String)> = v["deliverables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["name"].as_str().unwrap().to_owned(), x["sha256"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(digests.len(), 2, "{v}");
    for (name, sha) in &digests {
        assert!(page.body.contains(&format!("<code>{sha}</code>")) && page.body.contains(&format!(">{name}</a>")), "{name}: {}", page.body);
    }
    // A download is the deliverable's bytes, under its name.
    let (name, sha) = digests.iter().find(|(n, _)| n == "out.txt").unwrap();
    let got = get(&d, &cookie, &format!("/console/deliverables/{sha}?name={name}"));
    assert_eq!((got.status, got.body.as_str()), (200, "data\n"));
    assert_eq!(got.header("content-disposition"), Some("attachment; filename=\"out.txt\""));
    let anonymous = http(&d, "GET", &format!("/console/deliverables/{sha}"), &[]);
    assert_eq!(anonymous.status, 303, "no session, no download: sent to log in");
    assert!(anonymous.body.is_empty() && anonymous.header("location").unwrap().starts_with("/console/login"));

    // A deliverable changed in the store: the page says which, and why.
    let stored = d.home().join("blobs/deliverables").join(&sha[..2]).join(sha);
    assert!(stored.exists(), "{}", stored.display());
    std::fs::write(&stored, "tampered\n").unwrap();
    let page = get(&d, &cookie, &format!("/console/deliveries/{record}")).body;
    assert!(page.contains("<span class=\"no\">does not verify</span>"), "{page}");
    assert!(page.contains("deliverable out.txt (from the store) does not match the record"), "{page}");
    assert_eq!(get(&d, &cookie, &format!("/console/deliveries/{}", "0".repeat(64))).status, 404);
    assert_eq!(get(&d, &cookie, "/console/deliveries/not-a-digest").status, 400);
}

#[test]
fn the_system_page_draws_the_metrics_the_nodes_and_the_images() {
    let d = Daemon::start();
    let id = d.create(&["--name", "charted"]);
    d.ok(&["suspend", &id]);
    d.ok(&["resume", &id]);
    let cookie = log_in(&d);
    let page = get(&d, &cookie, "/console/system");
    assert_eq!(page.status, 200, "{}", page.body);
    let body = &page.body;
    assert_eq!(body.matches("<svg").count(), 3, "three charts: {body}");
    assert!(body.contains("aria-label=\"Tasks by state: ") && body.contains("running: 1"), "tasks by state: {body}");
    let wake = body.split("aria-label=\"Wake latency").nth(1).unwrap().split('"').next().unwrap();
    assert!(wake.contains(" ms: 1"), "one wake in its latency bucket: {wake}");
    let node = d.json(&["node", "list"]);
    let name = node[0]["name"].as_str().unwrap();
    assert!(body.contains(&format!("<td>{name}</td>")), "the node: {body}");
    let images = d.json(&["image", "list"]);
    let image = images[0]["name"].as_str().unwrap();
    assert!(body.contains(&format!("<code>{image}</code>")), "the image: {body}");
}

#[test]
fn the_console_in_a_real_browser() {
    let begun = Instant::now();
    common::browser::require_browser();
    let d = Daemon::start();
    let watched = d.create(&["--name", "watched-task"]);
    let (code, _, err) = d.sh(&watched, "echo first > /workspace/a");
    assert_eq!(code, 0, "{err}");
    d.json(&["deliver", &watched, "--file", "/workspace/a"]);
    for i in 0..3 {
        d.create(&["--name", &format!("other-{i}")]);
    }
    let waiting = d.create(&["--name", "needs-approval"]);
    d.ok(&["snapshot", &waiting, "--kind", "milestone", "--note", "ready"]);
    d.sh(&waiting, "echo changed > /workspace/b");
    let w = d.json(&["wait", &waiting, "--approval", "Deploy the <b>release</b>?"]);
    assert_eq!(w["state"], "pending", "{w}");

    let shots = d.home().join("shots");
    std::fs::create_dir_all(&shots).unwrap();
    let driver = include_str!("console_driver.py");
    let r = common::browser::drive(driver, &d.home().join("browser"), &[&d.url, &token(&d), "watched-task", &waiting, shots.to_str().unwrap()]);

    let login = &r["login"];
    assert!(login["after_login"].as_str().unwrap().ends_with('/'), "{r}");
    assert!(login["wrong_token"].as_str().unwrap().contains("not the daemon"), "{r}");
    let cookie = &r["cookie"][0];
    assert_eq!((cookie["name"].as_str(), cookie["httpOnly"].as_bool(), cookie["sameSite"].as_str()), (Some("cairn_session"), Some(true), Some("Strict")), "{r}");
    assert_eq!(r["all_rows"], 5, "every task listed: {r}");
    assert_eq!(r["filtered_rows"], 1, "the filter finds one: {r}");
    assert!(r["filtered_text"].as_str().unwrap().contains("watched-task"), "{r}");
    assert!(r["ledger"].as_str().unwrap().starts_with("verified: "), "the script put the ledger's verdict in: {r}");
    let live = &r["live"];
    assert!(live["row"].as_str().unwrap().contains("console-live-marker") && live["row"].as_str().unwrap().contains("exit 3"), "{r}");
    assert_eq!(live["after"].as_u64().unwrap(), live["before"].as_u64().unwrap() + 1, "one row came live: {r}");
    let running = &r["running"];
    assert_eq!(running["while_running"], true, "the output was on the page while the command ran: {r}");
    assert!(running["text"].as_str().unwrap().contains("<i>running-output</i> 2"), "written as text: {r}");
    assert_eq!(running["markup"], 0, "never as markup: {r}");
    assert!(running["head"].as_str().unwrap().contains("running-output") && running["head"].as_str().unwrap().contains("running)"), "{r}");
    assert!(running["ended"].as_str().unwrap().ends_with("exit 0)"), "{r}");
    let card = r["approval_card"].as_str().unwrap();
    assert!(card.contains("Deploy the <b>release</b>?"), "the prompt as text: {card}");
    assert!(card.contains("needs-approval") && card.contains("/workspace/b"), "the task and what changed since its milestone: {card}");
    assert!(r["after_approval"]["wake"].as_str().unwrap().contains("woken by"), "{r}");
    assert!(r["delivery"].as_str().unwrap().starts_with("verified: signed by node key "), "{r}");
    assert!(r["diff_tree"].as_str().unwrap().contains("workspace/"), "{r}");
    assert!(r["file_diff"].as_str().unwrap().contains("+changed"), "the file's diff in the browser: {r}");
    assert_eq!(r["charts"], 3, "{r}");
    assert!(r["after_logout"].as_str().unwrap().contains("/console/login"), "{r}");
    assert!(r["after_logout_home"].as_str().unwrap().contains("/console/login"), "logged out: {r}");
    assert_eq!(r["nojs_rows"], 5, "the list without JavaScript: {r}");
    assert!(r["nojs_timeline"].as_u64().unwrap() >= 4, "the timeline without JavaScript: {r}");
    assert_eq!(r["nojs_live_marker"], 1, "{r}");
    assert_eq!(r["nojs_live_indicator"], 0, "no live updates without the script: {r}");
    assert_eq!(r["nojs_approvals"], "Approvals", "{r}");

    d.wait_for_state(&waiting, "running", Duration::from_secs(20));
    let inbox = http(&d, "GET", &format!("/v1/tasks/{waiting}/inbox"), &["-H", &format!("authorization: Bearer {}", token(&d))]);
    let inbox: Value = serde_json::from_str(&inbox.body).unwrap();
    let decided = inbox.as_array().unwrap().iter().find(|e| e["source"] == "approval").unwrap_or_else(|| panic!("{inbox}"));
    let data = &decided["data"];
    assert_eq!((data["decision"].as_str(), data["by"].as_str()), (Some("approve"), Some("console")), "{decided}");
    assert_eq!(data["comment"], "approved from the console <b>ok</b>", "{decided}");
    for shot in ["tasks", "timeline", "delivery", "approvals", "diff", "system"] {
        let png = std::fs::read(shots.join(format!("{shot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 5000, "{shot}: a real screenshot");
    }
    keep_screenshots(&shots);
    eprintln!("console in the browser: Chromium {}, {:.1} s", r["browser"].as_str().unwrap_or("?"), begun.elapsed().as_secs_f64());
}

/// With `CAIRN_CONSOLE_SHOTS=DIR`, the screenshots are copied there (how
/// docs/console.md's pictures are made).
fn keep_screenshots(shots: &Path) {
    if let Ok(dir) = std::env::var("CAIRN_CONSOLE_SHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(shots).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), Path::new(&dir).join(e.file_name())).unwrap();
        }
    }
}
