# The console in headless Chromium, for crates/cli/tests/console.rs.
# Arguments: BASE_URL TOKEN TASK_NAME WAITING_TASK SHOTS_DIR.
# Logs in, finds TASK_NAME by the filter, opens its timeline and watches a
# command (run through the API meanwhile) appear live and another's output
# come as it runs, approves
# WAITING_TASK on the approvals page and sees its wake appear on its
# timeline, logs out; then reads the pages with JavaScript disabled.
# Prints one JSON object of what it saw; asserts on the way; always closes
# the browser.
import json
import sys
import urllib.request

try:
    from playwright.sync_api import sync_playwright
except ImportError as e:
    sys.exit(f"the playwright Python package is missing ({e}): python3 -m pip install playwright")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

base, token, task_name, waiting, shots = sys.argv[1:]


def api_exec(task, argv):
    """Runs a command through the HTTP API (not the browser)."""
    req = urllib.request.Request(f"{base}/v1/tasks/{task}/exec", method="POST",
                                 data=json.dumps({"cmd": argv}).encode(),
                                 headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def log_in(page):
    r = page.goto(base + "/")
    assert "/console/login" in page.url, f"not sent to the login form: {page.url}"
    page.locator("#token").fill("not-the-token")
    page.get_by_role("button", name="Log in").click()
    wrong = page.locator(".problem").inner_text()
    page.locator("#token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Tasks").wait_for()
    return {"first_status": r.status, "wrong_token": wrong, "after_login": page.url}


out = {}
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=15000)
    try:
        ctx = browser.new_context(viewport={"width": 1100, "height": 800})
        page = ctx.new_page()
        page.set_default_timeout(10000)
        out["login"] = log_in(page)
        cookies = ctx.cookies()
        out["cookie"] = [{k: c[k] for k in ("name", "httpOnly", "sameSite", "secure")} for c in cookies]
        out["all_rows"] = page.locator("table.tasks tbody tr").count()
        page.screenshot(path=f"{shots}/tasks.png", full_page=True)

        # Find the task by its name.
        page.locator('input[name="q"]').fill(task_name)
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url("**q=" + task_name + "**")
        rows = page.locator("table.tasks tbody tr")
        out["filtered_rows"] = rows.count()
        out["filtered_text"] = rows.first.inner_text()

        # Its timeline, live: a command run meanwhile appears without a reload.
        rows.first.locator("a").click()
        page.locator("p.live").wait_for()
        page.wait_for_function("document.querySelector('p.live').textContent === 'live'")
        page.locator("#ledger span.ok").wait_for()
        out["ledger"] = page.locator("#ledger").inner_text()
        before = page.locator("ol.timeline li").count()
        marker = "console-live-marker"
        api_exec(task_name, ["sh", "-c", f"echo {marker}; exit 3"])
        row = page.locator("ol.timeline li.exec", has_text=marker)
        row.wait_for()
        out["live"] = {"before": before, "after": page.locator("ol.timeline li").count(),
                       "row": row.inner_text(), "url": page.url}

        # A running command's output appears as it comes, as text.
        import threading
        script = "for i in 1 2 3 4 5 6; do echo '<i>running-output</i>' $i; sleep 0.5; done"
        runner = threading.Thread(target=api_exec, args=(task_name, ["sh", "-c", script]))
        runner.start()
        try:
            block = page.locator("#running div.cmd.running pre", has_text="running-output</i> 2")
            block.wait_for(timeout=20000)
            out["running"] = {"while_running": runner.is_alive(), "text": block.inner_text(),
                              "markup": page.locator("#running i").count(),
                              "head": page.locator("#running div.cmd p.head").last.inner_text()}
            page.screenshot(path=f"{shots}/timeline.png", full_page=True)
        finally:
            runner.join(timeout=30)
        page.locator("#running div.cmd p.head", has_text="exit 0").wait_for()
        out["running"]["ended"] = page.locator("#running div.cmd p.head").last.inner_text()

        # Its delivery, verified by the daemon.
        page.get_by_role("link", name="the record, verified").click()
        page.locator("p.verdict span.ok").wait_for()
        out["delivery"] = page.locator("p.verdict").inner_text()
        page.screenshot(path=f"{shots}/delivery.png", full_page=True)

        # Approve the waiting task; its wake shows on its timeline.
        page.get_by_role("link", name="Approvals").click()
        card = page.locator(f"#approval-{waiting}")
        card.wait_for()
        out["approval_card"] = card.inner_text()
        page.screenshot(path=f"{shots}/approvals.png", full_page=True)
        card.locator("textarea").fill("approved from the console <b>ok</b>")
        card.get_by_role("button", name="Approve").click()
        page.wait_for_url(f"**/console/tasks/{waiting}")
        page.locator("ol.timeline li.wake").wait_for(timeout=20000)
        out["after_approval"] = {"url": page.url, "wake": page.locator("ol.timeline li.wake").first.inner_text()}

        # What changed between its milestone and its suspend snapshot.
        page.get_by_role("link", name="the list, and what changed between two").click()
        page.locator("a", has_text="since").first.click()
        page.locator("ul.tree").first.wait_for()
        out["diff_tree"] = page.locator("ul.tree").first.inner_text()
        page.get_by_role("link", name="b", exact=True).click()
        page.locator("pre.diff").wait_for()
        out["file_diff"] = page.locator("pre.diff").inner_text()
        page.screenshot(path=f"{shots}/diff.png", full_page=True)

        page.get_by_role("link", name="System").click()
        page.locator("figure.chart svg").first.wait_for()
        out["charts"] = page.locator("figure.chart svg").count()
        page.screenshot(path=f"{shots}/system.png", full_page=True)

        # Log out: the session is gone, also for a copy of its cookie.
        page.get_by_role("button", name="Log out").click()
        page.wait_for_url("**/console/login**")
        out["after_logout"] = page.url
        r = page.goto(base + "/")
        out["after_logout_home"] = page.url

        # JavaScript off: every page still shows its data.
        nojs = browser.new_context(java_script_enabled=False)
        page = nojs.new_page()
        page.set_default_timeout(10000)
        log_in(page)
        out["nojs_rows"] = page.locator("table.tasks tbody tr").count()
        page.goto(f"{base}/console/tasks/{task_name}")
        out["nojs_timeline"] = page.locator("ol.timeline li").count()
        out["nojs_live_marker"] = page.locator("ol.timeline li.exec", has_text=marker).count()
        out["nojs_live_indicator"] = page.locator("p.live").count()
        page.goto(f"{base}/console/approvals")
        out["nojs_approvals"] = page.locator("h1").inner_text()
        out["browser"] = browser.version
        print(json.dumps(out))
    finally:
        browser.close()
