//! A real S3-compatible server for tests: moto's server (PyPI's
//! `moto[server]`) on a free loopback port, stopped when dropped.
//!
//! moto accepts any credentials. Its recorder keeps a log of the requests
//! it serves, which tests read to see what a client asked for.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

/// A running moto server. Dropping it kills the server (also when the test
/// that started it fails, as the test unwinds); a test process killed
/// outright takes the server with it (a parent-death signal).
#[derive(Debug)]
pub struct Moto {
    child: Child,
    port: u16,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    log: PathBuf,
    recording: PathBuf,
}

/// One request the server served, from its recorder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// Path and query, e.g. `/bucket/prefix/packs/ab/abcd…`.
    pub path: String,
}

/// Credentials moto accepts (any would do).
pub const ACCESS_KEY: &str = "test";
pub const SECRET_KEY: &str = "test";
pub const REGION: &str = "us-east-1";

impl Moto {
    /// A server shared by the tests of this process that run at the same
    /// time (each should use its own bucket): started by the first, stopped
    /// when the last one holding it drops it.
    pub fn shared() -> Arc<Moto> {
        static SHARED: Mutex<Weak<Moto>> = Mutex::new(Weak::new());
        let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = slot.upgrade() {
            return m;
        }
        let m = Arc::new(Moto::start());
        *slot = Arc::downgrade(&m);
        m
    }

    /// Starts the server and waits until it answers. Panics, saying how to
    /// install it, when moto is missing: the S3 tests never skip.
    pub fn start() -> Moto {
        let probe = Command::new("python3").args(["-c", "import moto.server"]).output();
        match probe {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "the S3 tests need moto's S3 server: pip install 'moto[server]' ({})",
                String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
            ),
            Err(e) => panic!("the S3 tests need python3 and moto's S3 server (pip install 'moto[server]'): {e}"),
        }
        let mut last = String::new();
        // The free port is found by binding and closing: another process may
        // take it meanwhile, so try a few.
        for _ in 0..3 {
            match Self::try_start() {
                Ok(m) => return m,
                Err(e) => last = e,
            }
        }
        panic!("moto's server did not start: {last}");
    }

    fn try_start() -> Result<Moto, String> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
        let base = std::env::temp_dir().join(format!("cairn-moto-{}-{port}", std::process::id()));
        let (log, recording) = (base.with_extension("log"), base.with_extension("recording"));
        let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .env("MOTO_RECORDER_FILEPATH", &recording)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
            .stderr(log_file);
        let child = spawn_tied(cmd).map_err(|e| format!("cannot run python3 -m moto.server: {e}"))?;
        let mut moto = Moto { child, port, endpoint: format!("http://127.0.0.1:{port}"), log, recording };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if moto.http("GET", "/", b"").is_ok_and(|(status, _)| status == 200) {
                return Ok(moto);
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!("it exited with {status}: {}", moto.log_tail()));
            }
            if Instant::now() > deadline {
                return Err(format!("no answer on port {port} within 60 s: {}", moto.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The end of the server's log, for a failure message.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join(" | ")
    }

    /// Makes a bucket.
    pub fn create_bucket(&self, name: &str) {
        let (status, body) = self.http("PUT", &format!("/{name}"), b"").unwrap();
        assert_eq!(status, 200, "creating bucket {name}: {}", String::from_utf8_lossy(&body));
    }

    /// The keys under `prefix` in `bucket` (up to a thousand).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) = self.http("GET", &format!("/{bucket}?list-type=2&max-keys=1000&prefix={prefix}"), b"").unwrap();
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 200, "listing {bucket}: {body}");
        body.split("<Key>").skip(1).filter_map(|s| s.split_once("</Key>")).map(|(k, _)| k.to_string()).collect()
    }

    /// Settings for [`crate::ObjectStoreBackend::s3`] that point it here
    /// (the same as [`Moto::env`], as configuration keys).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        self.config().into_iter().map(|(_, key, value)| (key, value)).collect()
    }

    /// The standard environment that points an S3 client (a daemon) here.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.config().into_iter().map(|(var, _, value)| (var, value)).collect()
    }

    /// (environment variable, configuration key, value)
    fn config(&self) -> Vec<(&'static str, &'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", "aws_endpoint_url", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "aws_access_key_id", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key", SECRET_KEY.to_string()),
            ("AWS_REGION", "aws_region", REGION.to_string()),
            ("AWS_ALLOW_HTTP", "aws_allow_http", "true".to_string()),
        ]
    }

    /// Starts the recorder afresh: requests served from now on are logged.
    pub fn start_recording(&self) {
        for op in ["reset-recording", "start-recording"] {
            let (status, _) = self.http("POST", &format!("/moto-api/recorder/{op}"), b"").unwrap();
            assert_eq!(status, 200, "{op}");
        }
    }

    /// Stops the recorder and returns the requests served since it started.
    pub fn stop_recording(&self) -> Vec<Request> {
        let (status, _) = self.http("POST", "/moto-api/recorder/stop-recording", b"").unwrap();
        assert_eq!(status, 200, "stop-recording");
        let (status, body) = self.http("GET", "/moto-api/recorder/download-recording", b"").unwrap();
        assert_eq!(status, 200, "download-recording");
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let url = v["url"].as_str().unwrap_or_default();
                let path = url.find("://").and_then(|i| url[i + 3..].find('/').map(|j| &url[i + 3 + j..])).unwrap_or(url);
                Request { method: v["method"].as_str().unwrap_or_default().to_string(), path: path.to_string() }
            })
            .collect()
    }

    /// One plain HTTP/1.1 request to the server; its status and body.
    pub fn http(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", self.port, body.len());
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| std::io::Error::other("no HTTP response head"))?;
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
        let mut body = raw[split + 4..].to_vec();
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            body = dechunk(&body);
        }
        Ok((status, body))
    }
}

/// Spawns `cmd` with a parent-death signal (SIGKILL). The signal follows
/// the thread that forks, not the process, and test threads end with their
/// tests: so every server is forked by one thread that lives as long as the
/// process.
fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    // SAFETY: prctl is async-signal-safe and touches no memory of the
    // parent; it runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("moto-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .unwrap();
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    keeper.lock().unwrap_or_else(PoisonError::into_inner).send((cmd, reply)).map_err(|_| std::io::Error::other("the spawning thread is gone"))?;
    answer.recv().map_err(|_| std::io::Error::other("the spawning thread is gone"))?
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(&self.recording);
    }
}
