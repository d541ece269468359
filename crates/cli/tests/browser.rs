//! The approval page in a real browser: headless Chromium, driven by
//! Playwright for Python, opens the signed link a `wait --approval` prints,
//! reads the prompt (shown as text, never as markup), types a comment,
//! clicks Approve, and the task wakes with its files intact. The same link
//! opened again says it was answered already; a link with a forged
//! signature says it is not valid.
//!
//! Needs `python3`, the `playwright` Python package and Debian's Chromium
//! (`scripts/setup-debian.sh` installs both); the test fails, never skips,
//! when one is missing.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::Value;

/// Drives the browser: `URL PROMPT COMMENT TAMPERED SHOT`. Checks the
/// pending page, types the comment, clicks Approve and waits for the
/// confirmation (screenshot at SHOT, the filled form next to it); then, in
/// the same browser, opens URL again and TAMPERED. Prints one JSON object;
/// asserts on the way, and closes the browser whatever happens.
const DRIVER: &str = r#"
import json, sys
from urllib.parse import parse_qs, urlsplit
try:
    from playwright.sync_api import sync_playwright
except ImportError as e:
    sys.exit(f"the playwright Python package is missing ({e}): python3 -m pip install playwright")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

def visible_page(page):
    return {"title": page.title(), "heading": page.locator("h1").inner_text(),
            "text": page.locator("main").inner_text()}

def approve(page, url, prompt, comment, shot):
    out = {}
    r = page.goto(url)
    out["status"] = r.status
    out.update(visible_page(page))
    box = page.locator(".prompt")
    out["prompt_text"] = box.inner_text()
    out["prompt_html"] = box.inner_html()
    out["prompt_visible"] = page.get_by_text(prompt, exact=True).is_visible()
    out["em_elements"] = page.locator("em").count()
    assert out["status"] == 200, out
    assert out["prompt_text"] == prompt and out["prompt_visible"], f"the prompt is not shown as text: {out}"
    assert out["em_elements"] == 0, f"the prompt was rendered as markup: {out}"
    form = page.locator("form")
    out["form_method"] = form.get_attribute("method")
    out["form_action"] = form.get_attribute("action")
    page.locator('textarea[name="comment"]').fill(comment)
    page.screenshot(path=shot.replace(".png", "-form.png"), full_page=True)
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.locator('button[name="decision"][value="approve"]').click()
    r = posted.value
    out["post_status"] = r.status
    out["post_path"] = urlsplit(r.url).path
    out["post_form"] = {k: v[0] for k, v in parse_qs(r.request.post_data or "").items()}
    page.get_by_role("heading", name="Approved").wait_for()
    out["done"] = visible_page(page)
    page.screenshot(path=shot, full_page=True)
    return out

def refused(page, url):
    r = page.goto(url)
    return {"status": r.status, **visible_page(page), "buttons": page.locator("button").count()}

url, prompt, comment, tampered, shot = sys.argv[1:]
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=15000)
    try:
        page = browser.new_page(viewport={"width": 900, "height": 760})
        page.set_default_timeout(5000)
        out = {"pending": approve(page, url, prompt, comment, shot)}
        out["again"] = refused(page, url)
        page.screenshot(path=shot.replace(".png", "-again.png"), full_page=True)
        out["forged"] = refused(page, tampered)
        out["browser"] = browser.version
        print(json.dumps(out))
    finally:
        browser.close()
"#;

/// The link with the first character of its signature changed.
fn tamper(url: &str) -> String {
    let (head, sig) = url.split_once("sig=").unwrap();
    let (sig, tail) = sig.split_once('&').map_or((sig, ""), |(s, t)| (s, t));
    let first = sig.chars().next().unwrap();
    let other = if first == 'A' { 'B' } else { 'A' };
    let amp = if tail.is_empty() { "" } else { "&" };
    format!("{head}sig={other}{}{amp}{tail}", &sig[first.len_utf8()..])
}

#[test]
fn approving_on_the_page_in_a_real_browser_wakes_the_task() {
    let begun = Instant::now();
    common::browser::require_browser();
    let d = Daemon::start();
    let id = d.create(&[]);
    let (code, _, err) = d.sh(&id, "echo 'release notes for v2' > /workspace/notes.txt");
    assert_eq!(code, 0, "{err}");

    let prompt = "Ship <em>v2</em>?";
    let comment = "Looks good — ship it & tell #releases";
    let w = d.json(&["wait", &id, "--approval", prompt]);
    assert_eq!((w["state"].as_str(), w["task_state"].as_str()), (Some("pending"), Some("suspended")), "{w}");
    let wait_id = w["id"].as_str().unwrap().to_owned();
    let url = w["approval_url"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&format!("{}/approve/{wait_id}?exp=", d.url)) && url.contains("&sig="), "{url}");

    // Approve in the browser, then open the same link again and a forged one.
    let forged = tamper(&url);
    assert_ne!(forged, url);
    let shot = d.home().join("approved.png");
    let r = common::browser::drive(DRIVER, &d.home().join("browser"), &[&url, prompt, comment, &forged, shot.to_str().unwrap()]);
    let s = &r["pending"];
    assert_eq!(s["status"], 200, "{s}");
    assert_eq!(s["heading"], "Approval requested", "{s}");
    assert_eq!(s["prompt_text"], prompt, "the prompt is shown as text: {s}");
    assert_eq!(s["prompt_html"], "Ship &lt;em&gt;v2&lt;/em&gt;?", "and escaped in the page: {s}");
    assert_eq!((s["prompt_visible"].as_bool(), s["em_elements"].as_u64()), (Some(true), Some(0)), "no <em> element: {s}");
    assert!(s["text"].as_str().unwrap().contains(&id), "the page names the task: {s}");
    assert_eq!((s["form_method"].as_str(), s["form_action"].as_str()), (Some("post"), Some(format!("/approve/{wait_id}").as_str())), "{s}");
    assert_eq!((s["post_status"].as_u64(), s["post_path"].as_str()), (Some(200), Some(format!("/approve/{wait_id}").as_str())), "{s}");
    let form = &s["post_form"];
    assert_eq!((form["decision"].as_str(), form["comment"].as_str()), (Some("approve"), Some(comment)), "what the browser sent: {s}");
    assert!(form["exp"].is_string() && url.contains(&format!("sig={}", form["sig"].as_str().unwrap())), "the link's proof went with the form: {s}");
    let done = &s["done"];
    assert_eq!(done["heading"], "Approved", "{s}");
    assert!(done["text"].as_str().unwrap().contains(comment), "the confirmation repeats the comment: {s}");
    let png = std::fs::read(&shot).expect("screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5000, "a real screenshot, {} bytes", png.len());

    // The task wakes with its files, and the decision reached it.
    d.wait_for_state(&id, "running", Duration::from_secs(10));
    let (code, out, err) = d.sh(&id, "cat /workspace/notes.txt");
    assert_eq!((code, out.as_str()), (0, "release notes for v2\n"), "{err}");
    let log = d.json(&["log", &id]);
    let approvals: Vec<&Value> = log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received" && e["args"]["source"] == "approval").collect();
    assert_eq!(approvals.len(), 1, "one approval event: {log}");
    assert_eq!(approvals[0]["args"]["satisfied"], wait_id.as_str(), "it satisfied the wait: {}", approvals[0]);
    assert!(log.as_array().unwrap().iter().any(|e| e["kind"] == "wake"), "{log}");
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let inbox = common::run(Command::new("curl")
        .args(["-sf", "-H", &format!("authorization: Bearer {}", token.trim()), &format!("{}/v1/tasks/{id}/inbox", d.url)]))
        .expect("curl");
    assert!(inbox.status.success(), "inbox: {}", String::from_utf8_lossy(&inbox.stderr));
    let inbox: Value = serde_json::from_slice(&inbox.stdout).unwrap();
    let decision = inbox.as_array().unwrap().iter().find(|e| e["source"] == "approval").unwrap_or_else(|| panic!("no approval in the inbox: {inbox}"));
    assert_eq!((decision["data"]["decision"].as_str(), decision["data"]["comment"].as_str()), (Some("approve"), Some(comment)), "{decision}");
    assert_eq!(decision["data"]["by"], "approval-page", "{decision}");

    // The same link again, and the forged one: pages that say why, no form.
    let again = &r["again"];
    assert_eq!((again["status"].as_u64(), again["heading"].as_str(), again["buttons"].as_u64()), (Some(409), Some("Already decided"), Some(0)), "{r}");
    assert!(again["text"].as_str().unwrap().contains("answered already"), "{r}");
    let bad = &r["forged"];
    assert_eq!((bad["status"].as_u64(), bad["heading"].as_str(), bad["buttons"].as_u64()), (Some(403), Some("Link not valid"), Some(0)), "{r}");
    assert_eq!(d.state(&id), "running", "neither changed anything");
    let log = d.json(&["log", &id]);
    assert_eq!(log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received").count(), 1, "{log}");
    eprintln!("browser test: Chromium {}, {:.1} s", r["browser"].as_str().unwrap_or("?"), begun.elapsed().as_secs_f64());
}
