//! Tests in a real browser: headless Chromium (Debian's), driven by a
//! Playwright for Python program the test passes; the browser is closed
//! whatever happens, and a test fails when one of its processes is left.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Fails, with the command that fixes it, when python3, playwright or
/// Chromium is missing.
pub fn require_browser() {
    let probe = super::run(Command::new("python3").args(["-c", "import playwright.sync_api"]).stdin(Stdio::null()));
    match probe {
        Err(e) => panic!("python3 is not installed ({e}): run scripts/setup-debian.sh, or apt-get install -y python3 python3-pip"),
        Ok(out) if !out.status.success() => panic!(
            "the playwright Python package is missing: python3 -m pip install playwright (or with --break-system-packages), as scripts/setup-debian.sh does: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Ok(_) => {}
    }
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: apt-get install -y chromium (scripts/setup-debian.sh installs it)");
}

/// Runs `driver` (a Python program) with `args`; returns the JSON object
/// it prints. Its temporary files (the browser profile) go under `tmp`;
/// afterwards no process may still use them.
pub fn drive(driver: &str, tmp: &Path, args: &[&str]) -> Value {
    std::fs::create_dir_all(tmp).expect("the browser's directory");
    let mut child = Command::new("python3")
        .args(["-c", driver])
        .args(args)
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("the driver's status") {
            break s;
        }
        if Instant::now() > deadline {
            // The driver closes the browser when its client goes away.
            let _ = child.kill();
            let _ = child.wait();
            panic!("the browser driver ran over a minute: {}", err.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    assert_no_browser_left(tmp);
    assert!(status.success(), "the browser driver failed ({status}):\n{err}\n{out}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("driver output is not JSON ({e}): {out}\n{err}"))
}

/// No process's command line mentions `tmp` (the browser's profile lives
/// there), so the browser was closed.
fn assert_no_browser_left(tmp: &Path) {
    let needle = tmp.as_os_str().as_encoded_bytes().to_vec();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_slice())))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "browser processes still running: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

