//! `cairn image pull` against a real registry on loopback: Debian's
//! `docker-registry`, started by each test on 127.0.0.1:0 with its storage
//! in a temporary directory, fed with OCI layouts the tests write and push
//! with `skopeo`; the token-auth test runs a token server of its own. Needs
//! root, busybox (the images' shell), and the `docker-registry`, `skopeo`
//! and `apache2-utils` packages.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;

use cairn_image::testing::{for_platform, host_arch, tagged, LayerBlob, LayerTar, OciLayout};
use common::registry::{base_layer, Registry};
use common::Daemon;

/// The `service` and `issuer` of the token server and its registry.
const TOKEN_SERVICE: &str = "cairn-test-registry";
const TOKEN_ISSUER: &str = "cairn-test-token-issuer";

/// What the token server did: the scopes of each token it issued (joined
/// by spaces), the tokens themselves, and how many requests it refused.
#[derive(Default)]
struct TokenLog {
    issued: Vec<String>,
    tokens: Vec<String>,
    refused: usize,
}

/// A registry token server (the registry's `auth: token:` scheme) on
/// 127.0.0.1: `GET /token?service=..&scope=repository:NAME:ACTIONS`
/// with the right Basic credentials answers a JWT (ES256, its certificate
/// in the `x5c` header) granting the actions the scopes ask for; no or
/// wrong credentials get a 401. The registry trusts the certificate
/// through `rootcertbundle`. Its thread serves until the test ends.
struct TokenServer {
    port: u16,
    cert_pem: String,
    log: Arc<Mutex<TokenLog>>,
}

impl TokenServer {
    fn start(user: &str, password: &str) -> TokenServer {
        // rcgen makes a P-256 key by default; ring signs with it in the
        // fixed r||s form JWS wants.
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["cairn-test-token-issuer".to_owned()]).unwrap().self_signed(&key).unwrap();
        let rng = ring::rand::SystemRandom::new();
        let signer = ring::signature::EcdsaKeyPair::from_pkcs8(&ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING, &key.serialize_der(), &rng).unwrap();
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [STANDARD.encode(cert.der())]});
        let header = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(TokenLog::default()));
        let expected = format!("Basic {}", STANDARD.encode(format!("{user}:{password}")));
        let (user, served) = (user.to_owned(), log.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let sign = |claims: &serde_json::Value| {
                    let input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap()));
                    let sig = signer.sign(&rng, input.as_bytes()).unwrap();
                    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
                };
                serve_token(stream, &expected, &user, &served, sign);
            }
        });
        TokenServer { port, cert_pem: cert.pem(), log }
    }

    fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    /// The registry config's `auth:` section for this server, its
    /// certificate written to `bundle`.
    fn registry_auth(&self, bundle: &Path) -> String {
        fs::write(bundle, &self.cert_pem).unwrap();
        format!(
            "auth:\n  token:\n    realm: {}\n    service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
            self.realm(),
            bundle.display()
        )
    }

    fn issued(&self) -> Vec<String> {
        self.log.lock().unwrap().issued.clone()
    }

    fn tokens(&self) -> Vec<String> {
        self.log.lock().unwrap().tokens.clone()
    }

    fn refused(&self) -> usize {
        self.log.lock().unwrap().refused
    }
}

/// Answers one request of the token server (then closes the connection).
fn serve_token(mut stream: TcpStream, expected: &str, user: &str, log: &Mutex<TokenLog>, sign: impl Fn(&serde_json::Value) -> String) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let request = String::from_utf8_lossy(&request).into_owned();
    let mut lines = request.split("\r\n");
    let target = lines.next().unwrap_or_default().split(' ').nth(1).unwrap_or_default().to_owned();
    let authorization = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("authorization").then(|| value.trim().to_owned())
    });
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let params: Vec<(String, String)> =
        query.split('&').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (percent_decode(k), percent_decode(v))).collect();
    let service = params.iter().find(|(k, _)| k == "service").map(|(_, v)| v.as_str());
    let scopes: Vec<&str> = params.iter().filter(|(k, _)| k == "scope").map(|(_, v)| v.as_str()).collect();

    let reply = if path != "/token" || service != Some(TOKEN_SERVICE) {
        (400, String::new(), r#"{"details":"not a token request for this service"}"#.to_owned())
    } else if authorization.as_deref() != Some(expected) {
        log.lock().unwrap().refused += 1;
        (401, "WWW-Authenticate: Basic realm=\"cairn-test-token\"\r\n".to_owned(), r#"{"details":"incorrect username or password"}"#.to_owned())
    } else {
        // Grants each scope what it asks: `repository:NAME:ACTIONS`.
        let access: Vec<serde_json::Value> = scopes
            .iter()
            .flat_map(|s| s.split(' '))
            .filter_map(|s| {
                let (kind, rest) = s.split_once(':')?;
                let (name, actions) = rest.rsplit_once(':')?;
                Some(serde_json::json!({"type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}))
            })
            .collect();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let mut log = log.lock().unwrap();
        let claims = serde_json::json!({
            "iss": TOKEN_ISSUER,
            "sub": user,
            "aud": TOKEN_SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": format!("cairn-test-{}", log.tokens.len()),
            "access": access,
        });
        let token = sign(&claims);
        log.issued.push(scopes.join(" "));
        log.tokens.push(token.clone());
        (200, String::new(), serde_json::json!({"token": token, "access_token": token, "expires_in": 300}).to_string())
    };
    let (status, extra, body) = reply;
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        _ => "Bad Request",
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `%XX` and `+` of a query string decoded.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Replaces /etc/a and deletes /etc/c (a whiteout).
fn top_layer() -> LayerBlob {
    LayerBlob::gzip(&LayerTar::new().dir("etc").file("etc/a", b"top a\n").whiteout("etc", "c").finish())
}

fn one_file_layer(what: &str) -> LayerBlob {
    LayerBlob::gzip(&LayerTar::new().dir("etc").file("etc/which", format!("{what}\n").as_bytes()).finish())
}

fn layout_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new().prefix("cairn-oci-").tempdir_in("/var/tmp").unwrap();
    let dir = tmp.path().join(name);
    (tmp, dir)
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

fn layers_stored(d: &Daemon) -> Vec<String> {
    listing(&d.home().join("layers/sha256"))
}

fn images_stored(d: &Daemon) -> Vec<String> {
    listing(&d.home().join("images"))
}

#[test]
fn a_pulled_two_layer_image_runs_a_task_that_sees_the_stack() {
    common::require_root();
    let reg = Registry::start();
    let d = Daemon::start();
    let (_tmp, dir) = layout_dir("two");
    let (base, top) = (base_layer(), top_layer());
    OciLayout::single(&dir, &[base.clone(), top.clone()]);
    reg.push(&dir, "latest", "test/two:v1", None);

    let reference = format!("{}/test/two:v1", reg.host());
    let out = d.ok(&["image", "pull", "--insecure", &reference]);
    assert!(out.starts_with(&format!("pulled {reference} (2 layers, ")), "{out}");
    let listed = d.json(&["image", "list"]);
    let img = listed.as_array().unwrap().iter().find(|i| i["name"] == reference.as_str()).unwrap().clone();
    assert_eq!(img["kind"], "oci");
    assert_eq!(img["layers"], serde_json::json!([base.diff_id, top.diff_id]));
    assert_eq!(img["source"], reference.as_str());
    assert_eq!(img["config"]["cmd"], serde_json::json!(["/bin/sh"]));
    // The directory escapes the reference; image.json has the real name.
    let escaped = format!("127.0.0.1%3A{}%2Ftest%2Ftwo%3Av1", reg.port);
    let json: serde_json::Value = serde_json::from_slice(&fs::read(d.home().join("images").join(&escaped).join("image.json")).unwrap()).unwrap();
    assert_eq!(json["name"], reference.as_str());
    assert_eq!(layers_stored(&d).len(), 2);

    let id = d.create(&["--image", &reference]);
    assert_eq!(must(&d, &id, "cat /etc/a /etc/b"), "top a\nbase b\n");
    assert_eq!(must(&d, &id, "test -e /etc/c || echo gone"), "gone\n");

    // Named by --name; the same layers, nothing downloaded again.
    d.ok(&["image", "pull", "--insecure", "--name", "two-again", &reference]);
    assert_eq!(layers_stored(&d).len(), 2);
    let err = d.fails(&["image", "pull", "--insecure", &reference]);
    assert!(err.contains("already exists"), "{err}");

    d.ok(&["destroy", &id]);
    d.ok(&["image", "rm", &reference]);
    d.ok(&["image", "rm", "two-again"]);
    assert_eq!(layers_stored(&d), Vec::<String>::new());
}

#[test]
fn an_index_resolves_to_the_hosts_platform_and_a_digest_pulls_the_same() {
    common::require_root();
    let reg = Registry::start();
    let d = Daemon::start();
    let (_tmp, dir) = layout_dir("multi");
    let layout = OciLayout::create(&dir);
    let other = if host_arch() == "arm64" { "amd64" } else { "arm64" };
    let base = base_layer();
    let mine = layout.add_image(&[base.clone(), one_file_layer(host_arch())], host_arch(), serde_json::json!({"Cmd": ["/bin/sh"]}));
    let theirs = layout.add_image(&[base.clone(), one_file_layer(other)], other, serde_json::json!({"Cmd": ["/bin/sh"]}));
    let index = layout.add_index(&[for_platform(theirs, "linux", other), for_platform(mine.clone(), "linux", host_arch())]);
    layout.write_index(&[tagged(index, "multi")]);
    reg.push(&dir, "multi", "test/multi:v1", None);

    let reference = format!("{}/test/multi:v1", reg.host());
    let img = d.json(&["image", "pull", "--insecure", &reference]);
    assert_eq!(img["manifest_digest"], mine["digest"], "the host's platform's manifest");
    let id = d.create(&["--image", &reference]);
    assert_eq!(must(&d, &id, "cat /etc/which"), format!("{}\n", host_arch()));
    d.ok(&["destroy", &id]);

    // By digest: the host's manifest, named by the digest reference.
    let by_digest = format!("{}/test/multi@{}", reg.host(), mine["digest"].as_str().unwrap());
    let img = d.json(&["image", "pull", "--insecure", &by_digest]);
    assert_eq!(img["name"], by_digest.as_str());
    assert_eq!(img["manifest_digest"], mine["digest"]);
    let id = d.create(&["--image", &by_digest]);
    assert_eq!(must(&d, &id, "cat /etc/which"), format!("{}\n", host_arch()));
    d.ok(&["destroy", &id]);
}

#[test]
fn a_second_image_sharing_a_layer_downloads_only_its_new_layer() {
    common::require_root();
    let reg = Registry::start();
    let d = Daemon::start();
    let base = base_layer();
    let (_ta, da) = layout_dir("a");
    let (_tb, db) = layout_dir("b");
    OciLayout::single(&da, &[base.clone(), one_file_layer("a")]);
    OciLayout::single(&db, &[base.clone(), one_file_layer("b")]);
    reg.push(&da, "latest", "test/a:v1", None);
    reg.push(&db, "latest", "test/b:v1", None);
    d.ok(&["image", "pull", "--insecure", &format!("{}/test/a:v1", reg.host())]);
    let before = layers_stored(&d);
    assert_eq!(before.len(), 2);
    let base_dir = d.home().join("layers/sha256").join(base.diff_id.trim_start_matches("sha256:"));
    let base_made = fs::metadata(base_dir.join("layer.json")).unwrap().modified().unwrap();

    // The base layer's blob is made unreadable in the registry: a pull
    // that downloaded it would fail.
    fs::write(reg.blob_file(&base.digest()), b"not the layer").unwrap();
    d.ok(&["image", "pull", "--insecure", &format!("{}/test/b:v1", reg.host())]);
    let after = layers_stored(&d);
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(before.iter().all(|l| after.contains(l)));
    assert_eq!(fs::metadata(base_dir.join("layer.json")).unwrap().modified().unwrap(), base_made, "the base layer was kept, not unpacked again");
    assert!(!after.iter().any(|l| l.starts_with(".tmp-")), "{after:?}");
}

#[test]
fn a_registry_with_basic_auth_refuses_without_credentials_and_pulls_with_them() {
    common::require_root();
    let tmp = tempfile::tempdir().unwrap();
    let out = common::run(Command::new("htpasswd").args(["-Bbn", "user", "s3cret"])).expect("these tests need apache2-utils (htpasswd)");
    assert!(out.status.success());
    let htpasswd = tmp.path().join("htpasswd");
    fs::write(&htpasswd, &out.stdout).unwrap();
    let reg = Registry::start_with(&format!("auth:\n  htpasswd:\n    realm: cairn-test\n    path: {}\n", htpasswd.display()));
    let d = Daemon::start();
    let (_tl, dir) = layout_dir("auth");
    OciLayout::single(&dir, &[base_layer()]);
    reg.push(&dir, "latest", "test/auth:v1", Some("user:s3cret"));
    let reference = format!("{}/test/auth:v1", reg.host());

    let err = d.fails(&["image", "pull", "--insecure", &reference]);
    assert!(err.contains("refused access without authentication (401 Unauthorized)") && err.contains("--username"), "{err}");
    let err = d.fails(&["image", "pull", "--insecure", "--username", "user", &reference]);
    assert!(err.contains("password"), "{err}");
    // A wrong password, then the right one on stdin.
    let wrong = common::output_within(
        d.cmd().args(["image", "pull", "--insecure", "--username", "user", &reference]).env("CAIRN_REGISTRY_PASSWORD", "wrong").stdin(Stdio::null()),
        Duration::from_secs(60),
    );
    assert!(!wrong.status.success());
    let wrong = String::from_utf8_lossy(&wrong.stderr).trim().to_owned();
    assert_eq!(wrong.lines().count(), 1, "{wrong}");
    assert!(wrong.contains("refused access with the credentials given (401 Unauthorized)"), "{wrong}");
    assert_eq!(images_stored(&d).iter().filter(|n| n.contains("auth")).count(), 0);

    let mut child = d
        .cmd()
        .args(["image", "pull", "--insecure", "--username", "user", "--password-stdin", &reference])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let began = Instant::now();
    let out = common::output_of(child, common::CALL_DEADLINE).unwrap();
    assert!(began.elapsed() < Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&format!("pulled {reference}")));
    // The password is neither logged nor stored.
    assert!(!d.log().contains("s3cret"));
    let mut found = false;
    for name in images_stored(&d) {
        let json = fs::read_to_string(d.home().join("images").join(&name).join("image.json")).unwrap_or_default();
        assert!(!json.contains("s3cret"));
        found |= json.contains("test/auth:v1");
    }
    assert!(found);
}

#[test]
fn a_registry_with_token_auth_refuses_without_credentials_and_pulls_with_a_bearer_token() {
    common::require_root();
    let tmp = tempfile::tempdir().unwrap();
    let tokens = TokenServer::start("user", "t0ken-s3cret");
    let reg = Registry::start_with(&tokens.registry_auth(&tmp.path().join("token-certs.pem")));
    let d = Daemon::start();
    let (_tl, dir) = layout_dir("token");
    OciLayout::single(&dir, &[base_layer()]);
    // skopeo does the token dance itself, with the same server.
    reg.push(&dir, "latest", "test/token:v1", Some("user:t0ken-s3cret"));
    assert!(tokens.issued().iter().any(|s| s.contains("repository:test/token:pull,push")), "{:?}", tokens.issued());
    let reference = format!("{}/test/token:v1", reg.host());
    let (issued_before, refused_before) = (tokens.issued().len(), tokens.refused());

    // No credentials: the token server refuses, and so does the registry.
    let err = d.fails(&["image", "pull", "--insecure", &reference]);
    assert!(err.contains("refused access without authentication (401 Unauthorized)") && err.contains("--username"), "{err}");
    let err = d.fails(&["image", "pull", "--insecure", "--username", "user", &reference]);
    assert!(err.contains("password"), "{err}");
    // A wrong password: one line with the token server's refusal.
    let wrong = common::output_within(
        d.cmd().args(["image", "pull", "--insecure", "--username", "user", &reference]).env("CAIRN_REGISTRY_PASSWORD", "wrong").stdin(Stdio::null()),
        Duration::from_secs(60),
    );
    assert!(!wrong.status.success());
    let wrong = String::from_utf8_lossy(&wrong.stderr).trim().to_owned();
    assert_eq!(wrong.lines().count(), 1, "{wrong}");
    assert!(wrong.contains("refused access with the credentials given (authentication failed at its token server: "), "{wrong}");
    assert!(wrong.contains("incorrect username or password") && !wrong.contains("--username"), "{wrong}");
    assert_eq!(tokens.issued().len(), issued_before, "a token for no or wrong credentials: {:?}", tokens.issued());
    assert!(tokens.refused() >= refused_before + 2, "the pulls did not ask the token server");
    assert_eq!(images_stored(&d).iter().filter(|n| n.contains("token")).count(), 0);
    assert_eq!(layers_stored(&d), Vec::<String>::new());

    // The right password on stdin: one token, for pulling that repository
    // only, serves the whole pull (manifest, config, layers).
    let mut child = d
        .cmd()
        .args(["image", "pull", "--insecure", "--username", "user", "--password-stdin", &reference])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"t0ken-s3cret\n").unwrap();
    let began = Instant::now();
    let out = common::output_of(child, common::CALL_DEADLINE).unwrap();
    assert!(began.elapsed() < Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&format!("pulled {reference} (")), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(tokens.issued()[issued_before..], ["repository:test/token:pull".to_owned()]);
    // Neither the password nor the token is logged or stored.
    let token = tokens.tokens().pop().unwrap();
    assert!(!d.log().contains("t0ken-s3cret") && !d.log().contains(&token));
    let mut found = false;
    for name in images_stored(&d) {
        let json = fs::read_to_string(d.home().join("images").join(&name).join("image.json")).unwrap_or_default();
        assert!(!json.contains("t0ken-s3cret") && !json.contains(&token));
        found |= json.contains("test/token:v1");
    }
    assert!(found);
    assert_eq!(layers_stored(&d).len(), 1);

    let id = d.create(&["--image", &reference]);
    assert_eq!(must(&d, &id, "cat /etc/a /etc/b"), "base a\nbase b\n");
    d.ok(&["destroy", &id]);
}

#[test]
fn bad_pulls_fail_with_one_line_and_leave_nothing() {
    common::require_root();
    let reg = Registry::start();
    let d = Daemon::start();
    let images_before = images_stored(&d);
    let (base, top) = (base_layer(), top_layer());
    let (_tl, dir) = layout_dir("bad");
    OciLayout::single(&dir, &[base.clone(), top.clone()]);
    reg.push(&dir, "latest", "test/tampered:v1", None);
    reg.push(&dir, "latest", "test/truncated:v1", None);

    let check_nothing_left = |what: &str| {
        assert_eq!(images_stored(&d), images_before, "{what}: an image was left");
        let layers = layers_stored(&d);
        assert!(layers.is_empty(), "{what}: layers or staging files were left: {layers:?}");
    };

    // Unknown repository, unknown tag.
    for missing in ["test/nope:v1", "test/tampered:nope"] {
        let err = d.fails(&["image", "pull", "--insecure", &format!("{}/{missing}", reg.host())]);
        assert!(err.contains("no such image"), "{err}");
        check_nothing_left(missing);
    }
    // Not a reference.
    let err = d.fails(&["image", "pull", "--insecure", "UPPER/Case:v1"]);
    assert!(err.contains("invalid"), "{err}");

    // The top layer's blob tampered with in the registry's storage: the
    // same length, other bytes.
    let file = reg.blob_file(&top.digest());
    let original = fs::read(&file).unwrap();
    let mut bytes = original.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    fs::write(&file, &bytes).unwrap();
    let err = d.fails(&["image", "pull", "--insecure", &format!("{}/test/tampered:v1", reg.host())]);
    assert!(err.contains("digest") && err.contains(&top.digest()), "{err}");
    check_nothing_left("tampered");

    // Truncated.
    fs::write(&file, &original[..original.len() - 100]).unwrap();
    let err = d.fails(&["image", "pull", "--insecure", &format!("{}/test/truncated:v1", reg.host())]);
    assert!(err.contains(&top.digest()), "{err}");
    check_nothing_left("truncated");

    // Restored, it pulls.
    fs::write(&file, &original).unwrap();
    d.ok(&["image", "pull", "--insecure", &format!("{}/test/truncated:v1", reg.host())]);
    assert_eq!(layers_stored(&d).len(), 2);
}

/// A pull counts against `[images] max_size` twice: the layers' declared
/// sizes before anything is downloaded, and what they unpack to while they
/// are written. Each refusal is one line naming the bound and leaves
/// nothing; an image within the bound pulls from the same daemon.
#[test]
fn an_oversized_pull_is_refused_before_its_download_and_a_bomb_while_it_unpacks() {
    common::require_root();
    let reg = Registry::start();
    let cfg = tempfile::tempdir().unwrap();
    let path = cfg.path().join("cairn.toml");
    fs::write(&path, "[images]\nmax_size = \"4M\"\n").unwrap();
    let d = Daemon::start_with(&["--config", path.to_str().unwrap()]);
    let images_before = images_stored(&d);
    let check_nothing_left = |what: &str| {
        assert_eq!(images_stored(&d), images_before, "{what}: an image was left");
        assert_eq!(layers_stored(&d), Vec::<String>::new(), "{what}: layers or staging files were left");
    };

    // 6 MiB that do not compress: over the bound as downloaded.
    let mut noise = vec![0u8; 6 << 20];
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for b in noise.iter_mut() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *b = seed as u8;
    }
    let (_t1, big) = layout_dir("big");
    OciLayout::single(&big, &[LayerBlob::gzip(&LayerTar::new().dir("opt").file("opt/noise", &noise).finish())]);
    reg.push(&big, "latest", "test/big:v1", None);
    let err = d.fails(&["image", "pull", "--insecure", &format!("{}/test/big:v1", reg.host())]);
    assert!(err.contains("its layers are") && err.contains("([images] max_size)"), "refused before the download: {err}");
    check_nothing_left("big");

    // 32 MiB of zeros, a few KiB compressed: downloaded, refused unpacking.
    let (_t2, bomb) = layout_dir("bomb");
    OciLayout::single(&bomb, &[LayerBlob::gzip(&LayerTar::new().dir("opt").file("opt/zeros", &vec![0u8; 32 << 20]).finish())]);
    reg.push(&bomb, "latest", "test/bomb:v1", None);
    let err = d.fails(&["image", "pull", "--insecure", &format!("{}/test/bomb:v1", reg.host())]);
    assert!(err.contains("\"/opt/zeros\"") && err.contains("([images] max_size)"), "refused while unpacking: {err}");
    check_nothing_left("bomb");

    // Control: an image within the bound pulls and runs.
    let (_t3, fits) = layout_dir("fits");
    OciLayout::single(&fits, &[base_layer(), top_layer()]);
    reg.push(&fits, "latest", "test/fits:v1", None);
    d.ok(&["image", "pull", "--insecure", "--name", "fits", &format!("{}/test/fits:v1", reg.host())]);
    let task = d.create(&["--image", "fits"]);
    assert_eq!(must(&d, &task, "echo ran"), "ran\n");
    d.ok(&["destroy", &task]);
    d.ok(&["image", "rm", "fits"]);
}

/// A registry over TLS with a certificate from its own CA: refused while the
/// daemon does not trust that CA (the error names the certificate), pulled
/// once it does (`SSL_CERT_FILE` naming the CA's bundle, as for any TLS
/// client of the host), with `--insecure` never given.
#[test]
fn a_registry_with_its_own_ca_is_pulled_over_tls_once_its_ca_is_trusted() {
    common::require_root();
    let certs = tempfile::Builder::new().prefix("cairn-registry-tls-").tempdir_in("/var/tmp").unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "cairn test registry CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.subject_alt_names.push(rcgen::SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    let leaf = params.signed_by(&key, &ca, &ca_key).unwrap();
    let (cert_path, key_path, ca_path) = (certs.path().join("cert.pem"), certs.path().join("key.pem"), certs.path().join("ca.pem"));
    fs::write(&cert_path, leaf.pem()).unwrap();
    fs::write(&key_path, key.serialize_pem()).unwrap();
    fs::write(&ca_path, ca.pem()).unwrap();
    let reg = Registry::start_with(&format!("  tls:\n    certificate: {}\n    key: {}\n", cert_path.display(), key_path.display()));
    let (_tmp, dir) = layout_dir("tls");
    OciLayout::single(&dir, &[base_layer()]);
    reg.push(&dir, "latest", "test/tls:v1", None);
    let reference = format!("{}/test/tls:v1", reg.host());

    // Not trusted: refused in one line, nothing stored.
    let untrusting = Daemon::start();
    let err = untrusting.fails(&["image", "pull", &reference]);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.to_lowercase().contains("certificate"), "the error names the certificate: {err}");
    assert_eq!(layers_stored(&untrusting), Vec::<String>::new());

    // Trusted: pulled over TLS, and a task runs on it.
    let ca_file = ca_path.display().to_string();
    let d = Daemon::start_with_env(&[], &[("SSL_CERT_FILE", ca_file.as_str())]);
    let out = d.ok(&["image", "pull", &reference]);
    assert!(out.starts_with(&format!("pulled {reference} (1 layers, ")) || out.starts_with(&format!("pulled {reference} (1 layer, ")), "{out}");
    let id = d.create(&["--image", &reference]);
    assert_eq!(must(&d, &id, "cat /etc/b"), "base b\n");
    d.ok(&["destroy", &id]);
}
