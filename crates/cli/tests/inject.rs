//! Secrets the proxy injects, end to end: a real sandbox whose `curl`
//! calls an HTTPS upstream on the host's loopback (its own CA, which the
//! daemon's `[egress] upstream_ca` trusts) through a host with a request
//! rule and an injected header. The request arrives with the secret; the
//! agent sees only the placeholder, and no byte of the secret is anywhere
//! the agent or the task's records can reach.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::Daemon;

const SECRET: &str = "ghp_InjectedOnly_7f3a9c2e";

/// An HTTPS echo server for `api.test`: answers each request with its head
/// (and the Authorization header again as `X-Echo-Authorization`).
/// Returns its port, its CA's PEM, and the heads it received.
fn upstream() -> (u16, String, Arc<Mutex<Vec<String>>>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "inject test upstream CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["api.test".to_owned()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()))
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for sock in listener.incoming().flatten() {
            let (config, record) = (config.clone(), record.clone());
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else { return };
                let mut tls = rustls::StreamOwned::new(conn, sock);
                let mut reader = BufReader::new(&mut tls);
                let mut head = String::new();
                let mut auth = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if line.to_ascii_lowercase().starts_with("authorization:") {
                        auth = line.split_once(':').unwrap().1.trim().to_owned();
                    }
                    head.push_str(&line);
                }
                // The proxy connects at CONNECT time: a connection that
                // ends without a request is no request.
                if head.is_empty() {
                    return;
                }
                record.lock().unwrap().push(head.clone());
                let _ = write!(tls, "HTTP/1.1 200 OK\r\nX-Echo-Authorization: {auth}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{head}", head.len());
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (port, ca.pem(), seen)
}

/// Every regular file under `dir` whose bytes hold `needle` (symbolic
/// links not followed).
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if meta.is_file() && read_no_follow(&path).is_some_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
            found.push(path.display().to_string());
        }
    }
    found
}

/// A regular file's bytes, opened without following a symbolic link (a
/// task disk is the sandbox's to change while it is read).
fn read_no_follow(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut out = Vec::new();
    file.read_to_end(&mut out).ok()?;
    Some(out)
}

/// The daemon's own files that could hold a task's data: its store and
/// log (the home's top), the blob store with every snapshot, the keys, the
/// trust layers, and each task disk (through its mount). Not the images,
/// which are the daemon's, nor the sandboxes' assembled roots.
fn daemon_files_holding(home: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(home)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| read_no_follow(&e.path()).is_some_and(|b| b.windows(needle.len()).any(|w| w == needle)))
        .map(|e| e.path().display().to_string())
        .collect();
    for sub in ["blobs", "keys", "trust"] {
        found.extend(files_holding(&home.join(sub), needle));
    }
    for run in std::fs::read_dir(home.join("run")).into_iter().flatten().flatten() {
        found.extend(files_holding(&run.path().join("disk"), needle));
    }
    found
}

fn set_secret(d: &Daemon, name: &str, value: &str) {
    let mut child = d.cmd().args(["secret", "set", name]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
    let out = common::output_of(child, common::CALL_DEADLINE).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn curl(d: &Daemon, task: &str, args: &str) -> String {
    let (code, out, err) = d.sh(task, &format!("curl -sS --max-time 20 {args}"));
    assert_eq!(code, 0, "curl {args}: {out}{err}");
    out
}

#[test]
fn an_injected_secret_reaches_the_upstream_and_nothing_the_agent_can_read() {
    let (port, ca_pem, seen) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let config = dir.path().join("egress.toml");
    std::fs::write(
        &config,
        format!("[egress]\nallow_private = [\"127.0.0.0/8\"]\nupstream_ca = {:?}\n\n[egress.hosts]\n\"api.test\" = \"127.0.0.1:{port}\"\n\"plain.test\" = \"127.0.0.1:{port}\"\n", ca_file.to_str().unwrap()),
    )
    .unwrap();
    let d = Daemon::start_with(&["--config", config.to_str().unwrap()]);
    set_secret(&d, "GITHUB_TOKEN", SECRET);

    // Bad input first: a rule naming a secret that does not exist.
    let err = d.fails(&["task", "create", "--allow", "api.test", "--inject", "api.test=Authorization: Bearer {{secret:NOPE}}"]);
    assert!(err.contains("NOPE") && err.contains("does not exist"), "{err}");
    let err = d.fails(&["task", "create", "--inject", "api.test=X-A: b"]);
    assert!(err.contains("allow the host first"), "{err}");

    let task = d.create(&[
        "--allow", "api.test", "--allow", "plain.test", "--rule", "api.test=GET /repos/acme/",
        "--inject", "api.test=Authorization: Bearer {{secret:GITHUB_TOKEN}}",
    ]);
    let echo = curl(&d, &task, "-D - https://api.test/repos/acme/tool");
    let head = seen.lock().unwrap().last().cloned().unwrap();
    assert!(head.contains(&format!("Bearer {SECRET}")), "the request arrives with the secret: {head}");
    assert!(echo.contains("Bearer $GITHUB_TOKEN") && !echo.contains(SECRET), "the agent sees the placeholder: {echo}");
    assert!(echo.to_ascii_lowercase().contains("x-echo-authorization: bearer $github_token"), "{echo}");
    // A method the rule does not allow: 403 naming the rule; nothing sent.
    let before = seen.lock().unwrap().len();
    let refused = curl(&d, &task, "-X POST -w ' %{http_code}' https://api.test/repos/acme/tool");
    assert!(refused.contains("api.test=GET /repos/acme/") && refused.ends_with(" 403"), "{refused}");
    assert_eq!(seen.lock().unwrap().len(), before);
    // A host without rules is a plain tunnel: the task's CA is not shown
    // there, so curl (trusting the image's roots and the task's CA only)
    // refuses the upstream's own certificate, and nothing is injected.
    let (code, _, err) = d.sh(&task, "curl -sS --max-time 20 https://plain.test/x");
    assert_ne!(code, 0, "plain.test's own certificate is not trusted in the sandbox");
    assert!(err.to_lowercase().contains("certificate"), "{err}");

    // No byte of the secret anywhere the agent or the records reach.
    // (The command names the secret in two halves: its argv is recorded.)
    let (half1, half2) = SECRET.split_at(8);
    let (_, found, _) = d.sh(&task, &format!("a={half1}; b={half2}; grep -rl \"$a$b\" /etc /root /tmp /var /workspace /proc/*/environ 2>/dev/null; env | grep -c \"$a$b\""));
    assert_eq!(found.trim(), "0", "found in the sandbox: {found}");
    let env = d.sh(&task, "echo $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS; grep -c 'BEGIN CERTIFICATE' /etc/cairn/egress-ca.pem").1;
    assert!(env.starts_with("/etc/cairn/ca-bundle.pem /etc/cairn/egress-ca.pem\n1"), "{env}");
    for view in [d.ok(&["--json", "task", "show", &task]), d.ok(&["--json", "egress", "log", &task]), d.ok(&["--json", "log", &task]), d.ok(&["--json", "secret", "list"])] {
        assert!(!view.contains(SECRET), "{view}");
    }
    let log = d.json(&["egress", "log", &task]);
    let req = log["decisions"].as_array().unwrap().iter().find(|e| e["kind"] == "intercepted" && e["status"] == 200).cloned().unwrap();
    assert_eq!(req["secrets"], serde_json::json!(["GITHUB_TOKEN"]));
    assert_eq!(req["rule"], "api.test=GET /repos/acme/");
    let listed = d.json(&["secret", "list"]);
    let uses = listed.as_array().unwrap().iter().find(|s| s["name"] == "GITHUB_TOKEN").unwrap()["uses"].as_i64().unwrap();
    assert!(uses >= 1, "{listed}");
    assert!(listed.as_array().unwrap().iter().all(|s| !s["name"].as_str().unwrap().contains('/')), "the tasks' CAs are not listed: {listed}");

    // Nor in the daemon's home: its store, logs, snapshots and blobs (the
    // task disks' images are scanned through their mounts).
    assert_eq!(daemon_files_holding(d.home.path(), SECRET.as_bytes()), Vec::<String>::new());
    // The scan sees what is there: a file the agent wrote (on its disk)
    // and the secret's name (in the store's events).
    let (m1, m2) = ("agent-wrote-", "this-marker");
    d.sh(&task, &format!("echo {m1}$(echo {m2}) > /workspace/marker"));
    let marker = format!("{m1}{m2}");
    assert!(daemon_files_holding(d.home.path(), marker.as_bytes()).iter().any(|f| f.contains("/disk/")), "the scan reaches the task disk");
    assert!(daemon_files_holding(d.home.path(), b"GITHUB_TOKEN").iter().any(|f| f.contains("cairn.db")), "the scan reaches the store");

    // Suspend and wake: the rules and the trust stay.
    d.ok(&["suspend", &task]);
    d.ok(&["resume", &task]);
    let again = curl(&d, &task, "https://api.test/repos/acme/again");
    assert!(again.contains("Bearer $GITHUB_TOKEN") && !again.contains(SECRET), "{again}");

    // The delivery record names the secrets the task's requests used and
    // where they went, never a value.
    let delivered = d.json(&["deliver", &task, "--file", "/workspace/marker"]);
    let payload = delivered["record"]["payload"].as_str().unwrap();
    let statement = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, payload).unwrap();
    assert!(!statement.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
    let statement: serde_json::Value = serde_json::from_slice(&statement).unwrap();
    let used = &statement["predicate"]["egress"]["secrets_used"];
    assert_eq!(used[0]["name"], "GITHUB_TOKEN", "{used}");
    assert_eq!(used[0]["hosts"], serde_json::json!(["api.test"]), "{used}");
    assert!(used[0]["requests"].as_u64().unwrap() >= 1, "{used}");
    assert_eq!(statement["predicate"]["egress"]["inject"], serde_json::json!(["api.test=authorization: Bearer {{secret:GITHUB_TOKEN}}"]));

    // A rollback and a fork keep them too (the fork with a CA of its own).
    let snap = d.json(&["snapshot", &task, "--kind", "milestone"])["id"].as_str().unwrap().to_owned();
    d.ok(&["rollback", &task, "--to", &snap, "--reason", "check the trust after a rollback"]);
    let again = curl(&d, &task, "https://api.test/repos/acme/rolled-back");
    assert!(again.contains("Bearer $GITHUB_TOKEN") && !again.contains(SECRET), "{again}");
    let kid = d.json(&["fork", &task, "--from", &snap]).as_array().unwrap()[0]["id"].as_str().unwrap().to_owned();
    let forked = curl(&d, &kid, "https://api.test/repos/acme/forked");
    assert!(forked.contains("Bearer $GITHUB_TOKEN") && !forked.contains(SECRET), "{forked}");
    assert_ne!(d.sh(&kid, "cat /etc/cairn/egress-ca.pem").1, d.sh(&task, "cat /etc/cairn/egress-ca.pem").1, "each task its own CA");
    let refused = curl(&d, &kid, "-X DELETE -w ' %{http_code}' https://api.test/repos/acme/tool");
    assert!(refused.ends_with(" 403"), "the fork keeps the rules: {refused}");
    d.ok(&["destroy", &kid]);

    // E2B's create takes the same rules in its `network` shape.
    let key = d.ok(&["api-key", "create", "inject-test"]).trim().to_owned();
    let body = r#"{"templateID":"base","network":{"allowOut":["api.test"],"inject":["api.test=Authorization: Bearer {{secret:GITHUB_TOKEN}}"]}}"#;
    let out = common::run(std::process::Command::new("curl").args(["-sS", "-X", "POST", &format!("{}/sandboxes", d.url), "-H", &format!("X-API-Key: {key}"), "-H", "Content-Type: application/json", "-d", body])).unwrap();
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    let e2b = created["sandboxID"].as_str().unwrap_or_else(|| panic!("{created}")).to_owned();
    let echo = curl(&d, &e2b, "https://api.test/from-e2b");
    assert!(echo.contains("Bearer $GITHUB_TOKEN") && !echo.contains(SECRET), "{echo}");
    d.ok(&["destroy", &e2b]);

    // A task without rules sees no CA of Cairn's.
    let plain = d.create(&["--allow", "plain.test"]);
    let (_, out, _) = d.sh(&plain, "ls /etc/cairn 2>&1; echo \"[$SSL_CERT_FILE]\"");
    assert!(out.contains("No such file") && out.contains("[]"), "{out}");
    d.ok(&["destroy", &plain]);
    d.ok(&["destroy", &task]);
    let mut leftover = String::new();
    for entry in std::fs::read_dir(d.home.path().join("trust")).into_iter().flatten().flatten() {
        leftover.push_str(&entry.path().display().to_string());
    }
    assert!(leftover.is_empty(), "trust layers left: {leftover}");
}
